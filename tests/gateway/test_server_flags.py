"""Gateway flags from vLLM: --response-role, --return-tokens-as-token-ids, request and uvicorn logs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gateway.config import GatewayConfig
from gateway.main import apply_log_settings
from tests.gateway.conftest import FakeRouter, sse_events
from tests.gateway.test_logprobs import script as logprobs_script

CHAT = [{"role": "user", "content": "hi"}]


async def test_response_role_names_the_reply(fake_router: FakeRouter, make_client: Callable[..., Any]) -> None:
    async for client in make_client(GatewayConfig(router_address=fake_router.address, response_role="model")):
        reply = (await client.post("/v1/chat/completions", json={"messages": CHAT})).json()
        assert reply["choices"][0]["message"]["role"] == "model"
        stream = await client.post("/v1/chat/completions", json={"messages": CHAT, "stream": True})
        first = sse_events(stream.text)[0]
        assert first["choices"][0]["delta"]["role"] == "model"


async def test_tokens_as_token_ids_by_default_unless_the_request_says(
    fake_router: FakeRouter, make_client: Callable[..., Any]
) -> None:
    fake_router.script = logprobs_script
    config = GatewayConfig(router_address=fake_router.address, return_tokens_as_token_ids=True)
    async for client in make_client(config):
        payload: dict[str, Any] = {"prompt": "ab", "logprobs": 1}
        logprobs = (await client.post("/v1/completions", json=payload)).json()["choices"][0]["logprobs"]
        assert logprobs["tokens"][0] == "token_id:11"
        payload["return_tokens_as_token_ids"] = False
        logprobs = (await client.post("/v1/completions", json=payload)).json()["choices"][0]["logprobs"]
        assert logprobs["tokens"][0] == "Hel"


def test_log_settings() -> None:
    apply_log_settings(GatewayConfig(router_address="r:1", enable_log_requests=True, uvicorn_log_level="debug"))
    assert logging.getLogger("uvicorn.access").level == logging.INFO
    assert logging.getLogger("uvicorn").level == logging.DEBUG
    apply_log_settings(GatewayConfig(router_address="r:1"))
    assert logging.getLogger("uvicorn.access").level == logging.WARNING
    assert logging.getLogger("uvicorn").level == logging.INFO
