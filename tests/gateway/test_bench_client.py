"""The service-path benchmark's bare HTTP client (benchmarks/service_ceiling.py) against the gateway: each
API it can load (`--ceiling-api`) is a request the gateway serves, and the client counts its tokens, on a
connection kept from one request to the next or on one per request."""

from __future__ import annotations

import pytest

from benchmarks import service_ceiling
from benchmarks.http_stream import HttpConnection
from tests.gateway.conftest import FakeRouter


@pytest.mark.parametrize("keep_alive", [True, False], ids=["kept", "per-request"])
@pytest.mark.parametrize("api", sorted(service_ceiling.APIS))
async def test_each_api_is_served_and_its_tokens_counted(
    api: str, keep_alive: bool, live_gateway: str, fake_router: FakeRouter
) -> None:
    port = int(live_gateway.rsplit(":", 1)[1])
    connection = HttpConnection(port, keep_alive)
    for _ in range(2):  # the second request on the first's connection, when kept
        tokens, first = await service_ceiling._gateway_stream(connection, [101, 102, 103], 16, api)
        assert tokens == 3  # the fake router's script: "Hello world" in 3 tokens
        assert first > 0
        assert (connection._streams is not None) == keep_alive  # open for the next request only when kept
    connection.close()
    request = fake_router.requests[0]
    assert len(fake_router.requests) == 2
    assert request.sampling_params.max_new_tokens == 16
    assert request.sampling_params.ignore_eos
    assert request.sampling_params.temperature == 0
    if api == "chat":
        assert [m.content for m in request.chat.messages] == ["w101 w102 w103"]
    else:
        assert list(request.input_ids.ids) == [101, 102, 103]
