"""docs/flags.md and README's vLLM/SGLang table agree with the flag declarations."""

from __future__ import annotations

import re
from pathlib import Path

from turnout import launcher
from turnout.flags_doc import render

ROOT = Path(__file__).resolve().parents[1]


def test_the_flags_page_is_written_from_the_declarations() -> None:
    assert (ROOT / "docs" / "flags.md").read_text() == render(), "run: python -m turnout.flags_doc > docs/flags.md"


def test_every_flag_of_the_readme_vllm_table_is_a_flag_of_turnout_serve() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Coming from vLLM / SGLang", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert len(rows) > 20
    options = launcher.build_parser()._option_string_actions
    for line in rows:
        for spelling in re.findall(r"`(--?[a-z][a-z0-9-]*)", line):
            assert spelling in options, f"README names {spelling}, which turnout serve does not take"
