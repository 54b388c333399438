"""The parser of every Turnout command: flags from a config file, the environment and the command line.

Where a value comes from, lowest first: the declared default, `--config FILE.yaml` (vLLM's: keys are
flag names without the dashes, `-` or `_`, any accepted spelling), `TURNOUT_<FLAG>` environment
variables (the first spelling's name, upper case, `-` as `_`), then the command line. Each layer is
parsed by argparse itself, so a value from a file or the environment is read and checked exactly as
on the command line; an error names its source and takes one line.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml

ENV_PREFIX = "TURNOUT_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class _Layered(list[Any]):
    """A list that came from a config file or the environment: the command line replaces it."""


class AppendAction(argparse.Action):
    """A repeatable flag (`--api-key A --api-key B`). A list from a lower layer is replaced, not
    extended: the command line wins over the file and the environment."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        items = getattr(namespace, self.dest, None)
        items = [] if items is None or isinstance(items, _Layered) or items is self.default else list(items)
        items.append(values)
        setattr(namespace, self.dest, items)


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser that also reads `--config FILE.yaml` and `TURNOUT_*` variables (file < env <
    command line), checks required flags after all three, and reports an error in one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self.required_flags: dict[str, str] = {}
        # dest of a positional -> dest of the flag it also spells (`turnout serve MODEL` / `--model`)
        self.positional_of: dict[str, str] = {}
        self._source = ""
        self.add_argument(
            "--config",
            metavar="FILE",
            help="YAML file of flags (keys: flag names without dashes); the environment and the command line "
            f"win over it. Each flag can also be set as ${ENV_PREFIX}<FLAG> (e.g. {ENV_PREFIX}MAX_MODEL_LEN)",
        )

    def error(self, message: str) -> NoReturn:
        """One line on stderr and exit 2 (argparse would print the whole usage first)."""
        source = f"{self._source}: " if self._source else ""
        self.exit(2, f"{self.prog}: error: {source}{message}\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        namespace = namespace or argparse.Namespace()
        if "-h" in argv or "--help" in argv:
            return super().parse_known_args(argv, namespace)
        config = _config_path(argv)
        if config is not None:
            self._apply_layer(self._file_layer(config), namespace, f"config file {config}")
        self._apply_layer(self._env_layer(), namespace, "environment")
        layered = {dest: getattr(namespace, dest, None) for dest in self.positional_of.values()}
        _, extras = super().parse_known_args(argv, namespace)  # fills `namespace` in place
        for positional, dest in self.positional_of.items():
            given = vars(namespace).pop(positional, None)
            if given is None:
                continue
            flagged = getattr(namespace, dest, None)
            if flagged not in (None, layered[dest], given):
                self.error(f"{given} and --{dest.replace('_', '-')} {flagged} disagree; give one")
            setattr(namespace, dest, given)
        missing = [name for dest, name in self.required_flags.items() if getattr(namespace, dest, None) is None]
        if missing:
            self.error(f"the following arguments are required: {', '.join(missing)}")
        return namespace, extras

    # A layer: (action, values as text) pairs. Switches are set directly (a false value must turn a
    # switch off, which has no spelling when the switch has no negation); the rest is parsed as words.
    def _apply_layer(
        self, layer: list[tuple[argparse.Action, list[str]]], namespace: argparse.Namespace, source: str
    ) -> None:
        if not layer:
            return
        self._source = source
        try:
            words: list[str] = []
            for action, items in layer:
                spelling = action.option_strings[0]
                if action.nargs == 0:
                    on = _truth(items[-1])
                    if on is None:
                        self.error(f"{spelling}: expected true or false, got {items[-1]!r}")
                    setattr(namespace, action.dest, action.const if on else not action.const)
                elif isinstance(action, AppendAction):
                    words += [w for item in items for w in (spelling, item)]
                else:
                    words += [spelling, *items]
            super().parse_known_args(words, namespace)
        finally:
            self._source = ""
        for dest, value in vars(namespace).items():
            if isinstance(value, list) and not isinstance(value, _Layered):
                setattr(namespace, dest, _Layered(value))

    def _options(self) -> dict[str, argparse.Action]:
        return {
            spelling: action
            for action in self._actions
            for spelling in action.option_strings
            if spelling.startswith("--") and action.dest not in ("help", "config")
        }

    def _file_layer(self, path: str) -> list[tuple[argparse.Action, list[str]]]:
        self._source = f"config file {path}"
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            self.error(f"cannot read it: {exc}")
        if not isinstance(data, dict):
            self.error("expected a mapping of flag names to values")
        options = self._options()
        layer = []
        for key, value in data.items():
            action = options.get("--" + str(key).replace("_", "-"))
            if action is None:
                self.error(f"unknown key {key!r} (no flag --{str(key).replace('_', '-')})")
            if value is None:
                continue
            items = value if isinstance(value, list) else [value]
            layer.append((action, [json.dumps(v) if isinstance(v, dict) else _yaml_word(v) for v in items]))
        self._source = ""
        return layer

    def _env_layer(self) -> list[tuple[argparse.Action, list[str]]]:
        environ = os.environ
        layer = []
        for action in self._actions:
            if not action.option_strings or action.dest in ("help", "config"):
                continue
            text = environ.get(env_name(action.option_strings[0]))
            if text is None or text == "":
                continue
            if action.nargs == 0:
                items = [text]
            elif isinstance(action, AppendAction):
                items = [line for line in text.split("\n") if line]  # one a line, as TURNOUT_API_KEY
            elif action.nargs in ("+", "*"):
                items = shlex.split(text)
            else:
                items = [text]
            layer.append((action, items))
        return layer


def env_name(spelling: str) -> str:
    """`--max-model-len` -> `TURNOUT_MAX_MODEL_LEN`."""
    return ENV_PREFIX + spelling.lstrip("-").upper().replace("-", "_")


def _truth(text: str) -> bool | None:
    lowered = text.strip().lower()
    return True if lowered in _TRUE else False if lowered in _FALSE else None


def _yaml_word(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _config_path(argv: list[str]) -> str | None:
    """The --config of a command line, read before the rest is parsed (its values are the base)."""
    path = None
    for i, word in enumerate(argv):
        if word == "--":
            break
        if word == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif word.startswith("--config="):
            path = word.split("=", 1)[1]
    return path
