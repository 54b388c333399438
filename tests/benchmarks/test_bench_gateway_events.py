"""bench_gateway_events: what it times is a whole SSE response of the replayed tokens, gathered into fewer
writes as the router's messages batch more, and every row reports."""

from __future__ import annotations

import asyncio
import json

import pytest

from benchmarks.bench_gateway_events import APIS, main, router_messages, stream


@pytest.mark.parametrize("api", sorted(APIS))
def test_the_replay_streams_every_token_then_done(api: str) -> None:
    writes = {}
    for per_message in (1, 8):
        data = asyncio.run(stream(api, router_messages(256, per_message)))
        writes[per_message] = len(data)
        events = [line.removeprefix(b"data: ") for line in b"".join(data).split(b"\n\n") if line]
        assert events[-1] == b"[DONE]"
        chunks = [json.loads(event) for event in events[:-1]]
        key = "text" if api == "completions" else "content"
        texts = [
            c["choices"][0]["text"] if key == "text" else c["choices"][0]["delta"].get("content", "") for c in chunks
        ]
        assert "".join(texts) == " tok" * 256
        assert [c["choices"][0]["finish_reason"] for c in chunks].count("length") == 1
    # A write per router message that brings text: ~one per token, or per 8 when the router batched 8.
    assert writes[1] >= 256
    assert writes[8] <= 256 // 8 + 3


def test_every_row_reports(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--tokens", "16", "--rounds", "2", "--repeats", "1", "--per-message", "1", "4"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split("|")[1].strip() for row in rows] == ["1", "4"]
    assert all(float(row.split("|")[2]) > 0 for row in rows)
