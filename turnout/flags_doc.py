"""docs/flags.md, written from the flag declarations: `python -m turnout.flags_doc > docs/flags.md`
(tests/test_flags_doc.py checks that the file matches them)."""

from __future__ import annotations

import sys

from turnout.flags import Declared, declared, shown
from turnout.serve_flags import CHILDREN, ServeConfig

HEADER = """# Flags

Written from the declarations on the config dataclasses (`python -m turnout.flags_doc > docs/flags.md`;
a test checks this file against them). Every flag is also

- a key of `--config FILE.yaml` (vLLM's format: the flag's name without the dashes, with `-` or `_`,
  any spelling listed here), e.g. `max-num-seqs: 64`;
- an environment variable `TURNOUT_<FLAG>`, from the first spelling (`TURNOUT_MAX_RUNNING_REQUESTS=64`;
  switches take `true`/`false`, repeatable flags one value a line, multi-value flags a space-separated list).

The command line wins over the environment, which wins over the file. `turnout serve` takes every flag
of every service below except the ones it sets itself (each child's `--model`, `--host`, `--port`, the
router's `--engine`/`--tokenizer` addresses and the gateway's `--router`), and passes each one given on
to the services it belongs to. Every service also takes `--log-level`, `--log-format`
([observability.md](observability.md)) and the security flags ([security.md](security.md)); the gRPC
services take `--metrics-port`. A flag for a capability Turnout does not have (e.g.
`--tensor-parallel-size 2`) takes only the value that works; any other is refused when the command line
is read (exit 2), with a message saying what is missing.
"""


def row(d: Declared) -> str:
    also = [f"`{a}`" for a in d.spec.aliases]
    also += [f"`{n}` (off)" for n in d.spec.negations]
    default = "required" if d.required else f"`{shown(d.default)}`"
    spelled = f"`{d.flag}`" if d.kind is bool else f"`{d.flag} {d.metavar}`"
    text = d.spec.help.replace("|", "\\|")
    return f"| {spelled} | {', '.join(also)} | {default} | {text} |"


def table(title: str, flags: list[Declared]) -> str:
    lines = [f"## {title}", "", "| Flag | Also spelled | Default | Meaning |", "| --- | --- | --- | --- |"]
    lines += [row(d) for d in flags]
    return "\n".join(lines)


def render() -> str:
    sections = [HEADER.rstrip(), table("`turnout serve` (its own)", declared(ServeConfig))]
    for child in CHILDREN:
        flags = [d for cls in child.configs for d in declared(cls)]
        sections.append(table(f"`turnout {child.service}`", flags))
    return "\n\n".join(sections) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
