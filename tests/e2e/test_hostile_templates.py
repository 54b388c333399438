"""Hostile chat templates through the whole stack: HTTP 400 with the template's message, never a 500,
and a looping template does not hold up anyone else's request."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

NESTED_LOOPS = "{% for i in range(15000) %}{% for j in range(15000) %}{% endfor %}{% endfor %}"


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, **extra}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"chat_template": "{% include 'x.jinja' %}"}, "chat templates cannot use {% include %}"),
        ({"chat_template": "{{ messages + 1 }}"}, "TypeError"),
        ({"chat_template_kwargs": {"messages": 5}}, "chat_template_kwargs may not set 'messages'"),
        ({"chat_template_kwargs": {"tools": "x"}}, "chat_template_kwargs 'tools' must be a list of objects"),
    ],
)
def test_a_bad_template_is_a_400_with_its_message(tiny_stack: Stack, extra: dict[str, Any], message: str) -> None:
    reply = httpx.post(f"{tiny_stack.base_url}/v1/chat/completions", json=chat_body(**extra), timeout=60)
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]["message"]


async def test_a_looping_template_is_stopped_and_holds_up_no_one(tiny_stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=tiny_stack.base_url, timeout=60) as client:
        attack = asyncio.ensure_future(client.post("/v1/chat/completions", json=chat_body(chat_template=NESTED_LOOPS)))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        tokenized = await client.post("/tokenize", json={"prompt": "The sky is blue"})
        assert tokenized.status_code == 200 and time.monotonic() - started < 1.0
        assert not attack.done()
        reply = await attack
    assert reply.status_code == 400
    assert "--chat-template-timeout" in reply.json()["error"]["message"]
    after = httpx.post(f"{tiny_stack.base_url}/v1/chat/completions", json=chat_body(), timeout=60)
    assert after.status_code == 200
