"""With --enable-log-requests the router logs one line per Generate request, at its end: where it ran, why, and
how it ended (docs/observability.md). A line per step, or two per request, cost the event loop as much as
routing; without the flag (the default, as in vLLM and SGLang) there is none."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from grpc import aio

from tests.router.conftest import text_of

Make = Callable[..., Any]


def router_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("services.router") and r.levelno >= logging.INFO]


async def test_one_line_per_request_at_its_end(make_cluster: Make, caplog: pytest.LogCaptureFixture) -> None:
    cluster = await make_cluster(2, policy="round_robin", enable_log_requests=True)
    caplog.set_level(logging.INFO)
    caplog.clear()
    assert text_of(await cluster.generate("hello")) == "<100><101><102>"
    (line,) = router_lines(caplog)
    ran_on = next(e for e in cluster.engines if e.received)
    assert line.getMessage() == "generated"
    fields = vars(line)  # the extra= fields are attributes of the record
    assert {k: fields[k] for k in ("engine", "route", "prompt_tokens", "completion_tokens", "status")} == {
        "engine": ran_on.address,
        "route": "round_robin",
        "prompt_tokens": len(ran_on.received[0].input_ids),
        "completion_tokens": 3,
        "status": "OK",
    }
    assert fields["request_id"] and fields["engine_request_id"] == ran_on.received[0].request_id
    assert fields["seconds"] >= 0


async def test_a_refused_request_logs_its_status(make_cluster: Make, caplog: pytest.LogCaptureFixture) -> None:
    cluster = await make_cluster(1, enable_log_requests=True)
    cluster.engines[0].fail = grpc.StatusCode.INVALID_ARGUMENT
    caplog.set_level(logging.INFO)
    caplog.clear()
    with pytest.raises(aio.AioRpcError):
        await cluster.generate("hello")
    (line,) = router_lines(caplog)
    fields = vars(line)
    assert line.getMessage() == "generated"
    assert fields["status"] == "INVALID_ARGUMENT" and fields["completion_tokens"] == 0


async def test_no_line_unless_asked(make_cluster: Make, caplog: pytest.LogCaptureFixture) -> None:
    cluster = await make_cluster(1)
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    assert text_of(await cluster.generate("hello")) == "<100><101><102>"
    assert [r.getMessage() for r in router_lines(caplog)] == []
