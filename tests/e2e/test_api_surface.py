"""The drop-in surface through all four real services: the official `openai` client, the
tokenizer endpoints against the model's own tokenizer, the SGLang server routes, and
`turnout.client` on the router."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tests.credentials import TEST_ADMIN_KEY
from tests.e2e.stack import Stack
from turnout.client import Client, TurnoutError

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0, "max_tokens": 6}


@pytest.fixture(scope="module")
def client(tiny_stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny_stack.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_tokenize_detokenize_round_trip_equals_the_tokenizer(tiny_stack: Stack, tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "Héllo, wörld! 1234 — tokens"
    reply = httpx.post(f"{tiny_stack.base_url}/tokenize", json={"prompt": text, "return_token_strs": True}).json()
    assert reply["tokens"] == tokenizer.encode(text)
    assert reply["count"] == len(reply["tokens"]) and reply["max_model_len"] == 4096
    assert reply["token_strs"] == [tokenizer.decode([i]) for i in reply["tokens"]]
    back = httpx.post(f"{tiny_stack.base_url}/detokenize", json={"tokens": reply["tokens"]}).json()
    assert back["prompt"] == tokenizer.decode(reply["tokens"], skip_special_tokens=True)
    messages = [{"role": "user", "content": "Hi there"}]
    chat = httpx.post(f"{tiny_stack.base_url}/tokenize", json={"messages": messages}).json()
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert chat["tokens"] == list(expected if isinstance(expected, list) else expected["input_ids"])


def test_completions_prompt_forms_n_and_echo(client: openai.OpenAI, model: str) -> None:
    text = client.completions.create(model=model, prompt="The sky is", **GREEDY)  # type: ignore[arg-type]
    ids = httpx.post(f"{client.base_url}".replace("/v1/", "/tokenize"), json={"prompt": "The sky is"}).json()
    by_ids = client.completions.create(model=model, prompt=ids["tokens"], **GREEDY)  # type: ignore[arg-type]
    assert by_ids.choices[0].text == text.choices[0].text
    batch = client.completions.create(model=model, prompt=[ids["tokens"], ids["tokens"]], n=2, **GREEDY)  # type: ignore[arg-type]
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert {c.text for c in batch.choices} == {text.choices[0].text}
    echoed = client.completions.create(model=model, prompt="The sky is", echo=True, **GREEDY)  # type: ignore[arg-type]
    assert echoed.choices[0].text == "The sky is" + text.choices[0].text


@pytest.mark.parametrize("include_usage", [None, False, True])
@pytest.mark.parametrize("continuous", [None, True])
def test_stream_options_matrix(
    client: openai.OpenAI, model: str, include_usage: bool | None, continuous: bool | None
) -> None:
    options: dict[str, bool] = {}
    if include_usage is not None:
        options["include_usage"] = include_usage
    if continuous is not None:
        options["continuous_usage_stats"] = continuous
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        stream=True,
        stream_options=options or None,  # type: ignore[arg-type]
        max_completion_tokens=4,
        max_tokens=50,  # max_completion_tokens wins
        temperature=0,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert sum(1 for c in chunks for ch in c.choices if ch.finish_reason is not None) == 1
    with_choices = [c for c in chunks if c.choices]
    if include_usage:
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens <= 4
        assert all((c.usage is not None) == bool(continuous) for c in with_choices)
    else:
        assert all(c.usage is None for c in chunks) and chunks[-1].choices


def test_unknown_fields_request_id_and_errors(client: openai.OpenAI, model: str, tiny_stack: Stack) -> None:
    reply = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi", "name": "ann"}],
        extra_body={"some_vendor_field": {"x": 1}},
        extra_headers={"X-Request-Id": "e2e-req-1"},
        max_tokens=2,
    )
    assert reply.headers["x-request-id"] == "e2e-req-1"
    assert reply.parse().id == "chatcmpl-e2e-req-1"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=model, prompt="x", suffix="y", max_tokens=1)
    assert bad.value.body["param"] == "suffix"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="x", max_tokens=10**6)


def test_sglang_server_routes(tiny_stack: Stack) -> None:
    base = tiny_stack.base_url
    assert httpx.get(f"{base}/health").status_code == 200
    assert httpx.get(f"{base}/health_generate", timeout=60).status_code == 200
    assert httpx.get(f"{base}/version").json()["version"]
    info = httpx.get(f"{base}/get_server_info").json()
    assert info["internal_states"][0]["routable"] is True
    # The engine is idle between requests: the flush happens.
    # The suite's admin key reaches the stack's children (tests/conftest.py).
    admin = {"Authorization": f"Bearer {TEST_ADMIN_KEY}"}
    flushed = httpx.post(f"{base}/flush_cache", headers=admin, timeout=30)
    assert flushed.status_code == 200, flushed.text


def test_turnout_client_on_the_real_router(tiny_stack: Stack, tiny_model_dir: Path) -> None:
    with Client(f"127.0.0.1:{tiny_stack.router_port}", timeout_s=60) as client:
        [done] = client.generate("Hello", max_new_tokens=3, temperature=0.0, ignore_eos=True)
        assert done.finish_reason == "length" and done.completion_tokens == 3 and len(done.token_ids) == 3
        streamed = "".join(e.text for e in client.generate_stream("Hello", max_new_tokens=3, temperature=0.0,
                                                                   ignore_eos=True) if hasattr(e, "text"))  # fmt: skip
        assert streamed == done.text
        assert client.detokenize(client.tokenize("Hello").ids, skip_special_tokens=True) == "Hello"
        assert client.list_models()[0].name == tiny_model_dir.name
        with pytest.raises(TurnoutError) as caught:
            client.generate("Hello", temperature=-1.0)
        assert caught.value.code.name == "INVALID_ARGUMENT"
