"""Every request parameter the three peers' documents name, by route, read from those documents.

The documents are the project's `../shared/reference/` (vLLM's OpenAI server page, SGLang's
sampling-parameters pages, Aphrodite's OpenAI server page). Each has its own layout, so each has
its own reader here; `extract` joins them into {route: sorted names}. The result is committed as
`peer_parameters.PEER_PARAMETERS`, so the table test runs where the documents are absent (a
fresh clone in CI); `test_peer_parameter_table` re-reads the documents when they are present
and fails if the committed list is stale. Print the list anew with:

    python -m tests.compat.peer_reference ../shared/reference > tests/compat/peer_parameters.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REFERENCE_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "reference"

# vLLM's page: a section title ending in '#' -> the route its parameter blocks belong to.
VLLM_SECTIONS = {
    "Completions API#": "/v1/completions",
    "Chat API#": "/v1/chat/completions",
    "Embeddings API#": "/v1/embeddings",
    "Transcriptions API#": "/v1/audio/transcriptions",
    "Tokenizer API#": "/tokenize",
    "Pooling API#": "/pooling",
    "Score API#": "/score",
    "Re-rank API#": "/rerank",
}
# Aphrodite's page: its '## Extra Parameters for ...' headings.
APHRODITE_SECTIONS = {"Chat API": "/v1/chat/completions", "Text Completions API": "/v1/completions"}
# SGLang's pages: parameters after this heading sit inside `/generate`'s `sampling_params`.
SGLANG_SAMPLING = re.compile(r"^## Sampling param", re.IGNORECASE)
SGLANG_ROUTE, SGLANG_SAMPLING_ROUTE = "/generate", "/generate sampling_params"


def _document(directory: Path, first_line: str) -> list[str]:
    """The lines of the one document in `directory` whose text contains `first_line`."""
    for path in sorted(directory.glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        if first_line in text:
            return text.splitlines()
    raise FileNotFoundError(f"no document in {directory} contains {first_line!r}")


def sglang(lines: list[str]) -> dict[str, set[str]]:
    """Bullets "* `name`: ..." (older page) and the first cells of the HTML tables (newer page)."""
    found: dict[str, set[str]] = {SGLANG_ROUTE: set(), SGLANG_SAMPLING_ROUTE: set()}
    route = SGLANG_ROUTE
    for line in lines:
        if SGLANG_SAMPLING.match(line):
            route = SGLANG_SAMPLING_ROUTE
        bullet = re.match(r"^\* `([a-z_0-9]+)`", line)
        cell = re.match(r"^\s*<td [^>]*fontWeight: 500[^>]*>([a-z_0-9\\]+)</td>", line)
        for match in (bullet, cell):
            if match:
                found[route].add(match.group(1).replace("\\_", "_"))
    return found


def vllm(lines: list[str]) -> dict[str, set[str]]:
    """Field declarations ("    name: type ...", four spaces in) under each API's section."""
    found: dict[str, set[str]] = {}
    route = None
    for line in lines:
        if line.strip() in VLLM_SECTIONS:
            route = VLLM_SECTIONS[line.strip()]
            found.setdefault(route, set())
        elif re.match(r"^[A-Z][A-Za-z -]* API#$", line.strip()):
            route = None  # a section this table does not list
        field = re.match(r"^    ([a-z_0-9]+): ", line)
        if route and field:
            found[route].add(field.group(1))
    return found


def aphrodite(lines: list[str]) -> dict[str, set[str]]:
    """Field declarations ("name: type = ...") in the code blocks of its two "Extra Parameters"
    sections, and the OpenAI parameters its page says it does not support."""
    found: dict[str, set[str]] = {route: set() for route in APHRODITE_SECTIONS.values()}
    route = None
    for line in lines:
        heading = re.match(r"^## Extra Parameters for (.+)$", line)
        if heading:
            route = APHRODITE_SECTIONS.get(heading.group(1).strip())
        elif line.startswith("## "):
            route = None
        field = re.match(r"^([a-z_0-9]+): ", line)
        if route and field:
            found[route].add(field.group(1))
        unsupported = re.match(r"^- in `(/v1/[a-z/]+)`: (.+)$", line)
        if unsupported:
            found[unsupported.group(1)].update(re.findall(r"`([a-z_]+)`", unsupported.group(2)))
    return found


def extract(directory: Path = REFERENCE_DIR) -> dict[str, list[str]]:
    """{route: sorted parameter names} over the three peers' documents in `directory`."""
    merged: dict[str, set[str]] = {}
    read = [vllm(_document(directory, "vLLM provides an HTTP server")), aphrodite(_document(directory, "Aphrodite"))]
    # SGLang has two pages (an older and a newer one): both are read.
    for path in sorted(directory.glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        if "sampling parameters of the SGLang Runtime" in text:
            read.append(sglang(text.splitlines()))
    for found in read:
        for route, names in found.items():
            merged.setdefault(route, set()).update(names)
    return {route: sorted(names) for route, names in sorted(merged.items())}


def render(parameters: dict[str, list[str]]) -> str:
    lines = [
        '"""Every request parameter the peers\' documents name, by route: written by',
        '`python -m tests.compat.peer_reference ../shared/reference` (see peer_reference.py); do not edit."""',
        "",
        "PEER_PARAMETERS: dict[str, list[str]] = {",
    ]
    for route, names in parameters.items():
        lines.append(f"    {route!r}: [")
        lines.extend(f"        {name!r}," for name in names)
        lines.append("    ],")
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(extract(Path(sys.argv[1]) if len(sys.argv) > 1 else REFERENCE_DIR)))
