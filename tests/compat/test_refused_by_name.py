"""Every peer parameter we know but cannot honour is a 400 that names it (never accepted and ignored);
its "off" value passes, since clients built for the peers send their defaults."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.compat.conftest import MODEL
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.default_model]

COMPLETION = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}
GENERATE = {"text": "Hello", "sampling_params": {"max_new_tokens": 2}}

REFUSED = [
    # Beam search is honoured; its refusals are in test_beam_search.py.
    ("/v1/completions", {"prompt_logprobs": 1, "prompt_logprobs_temperature": 0.5}, "prompt_logprobs_temperature"),
    # Hidden states come with whole replies only on the OpenAI routes (SGLang streams them on /generate).
    ("/v1/chat/completions", {"return_hidden_states": True, "stream": True}, "return_hidden_states"),
    ("/v1/completions", {"return_routed_experts": True}, "return_routed_experts"),
    ("/generate", {"return_routed_experts": True}, "return_routed_experts"),
    ("/generate", {"routed_experts_start_len": 4}, "routed_experts_start_len"),
    (
        "/v1/chat/completions",
        {"guided_json": {"type": "object"}, "guided_decoding_backend": "outlines"},
        "guided_decoding_backend",
    ),
    (
        "/v1/completions",
        {"guided_regex": "a+", "guided_decoding_backend": "lm-format-enforcer"},
        "guided_decoding_backend",
    ),
]

HARMLESS = [
    ("/v1/completions", {"use_beam_search": False, "length_penalty": 1.0, "early_stopping": False}),
    ("/v1/completions", {"prompt_logprobs": 1, "prompt_logprobs_temperature": 1.0}),
    ("/v1/chat/completions", {"return_hidden_states": False, "return_routed_experts": False}),
    ("/generate", {"return_hidden_states": False, "return_routed_experts": False, "routed_experts_start_len": 0}),
    ("/v1/chat/completions", {"guided_choice": ["yes", "no"], "guided_decoding_backend": "xgrammar"}),
    ("/v1/completions", {"guided_choice": ["yes", "no"], "guided_decoding_backend": "auto"}),
    ("/v1/completions", {"guided_choice": ["yes", "no"], "guided_decoding_backend": "xgrammar:disable-any-whitespace"}),
]


def _body(route: str, extra: dict[str, Any]) -> dict[str, Any]:
    base = {"/v1/completions": COMPLETION, "/v1/chat/completions": CHAT, "/generate": GENERATE}[route]
    return {**base, **extra}


@pytest.mark.parametrize(("route", "extra", "field"), REFUSED)
def test_refused_with_a_400_naming_the_field(
    compat_stack: Stack, route: str, extra: dict[str, Any], field: str
) -> None:
    reply = httpx.post(f"{compat_stack.base_url}{route}", json=_body(route, extra), timeout=300)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and f"'{field}'" in error["message"]


@pytest.mark.parametrize(("route", "extra"), HARMLESS)
def test_off_values_pass(compat_stack: Stack, route: str, extra: dict[str, Any]) -> None:
    reply = httpx.post(f"{compat_stack.base_url}{route}", json=_body(route, extra), timeout=300)
    assert reply.status_code == 200, reply.text


def test_priority_without_priority_scheduling_is_refused(compat_stack: Stack) -> None:
    """vLLM refuses a priority its scheduler would ignore; `turnout serve --scheduling-policy priority`
    honours it (tests/compat/test_priority.py)."""
    reply = httpx.post(f"{compat_stack.base_url}/v1/completions", json={**COMPLETION, "priority": 1}, timeout=300)
    assert reply.status_code == 400, reply.text
    assert "priority" in reply.json()["error"]["message"] and "--scheduling-policy" in reply.json()["error"]["message"]
    # Priority 0 is every request's default: it passes.
    ok = httpx.post(f"{compat_stack.base_url}/v1/completions", json={**COMPLETION, "priority": 0}, timeout=300)
    assert ok.status_code == 200, ok.text
