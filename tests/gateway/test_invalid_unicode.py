"""Text with lone surrogates anywhere in a JSON body is refused with 400 naming the field (never a 500)."""

from __future__ import annotations

import httpx
import pytest

from gateway.text_validity import invalid_text_path
from tests.gateway.conftest import FakeRouter

BAD = '"\\ud800"'
CHAT = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, %s}'
# (route, body with the bad string as %s, the field the error must name)
CASES = [
    ("/v1/completions", '{"prompt": %s}', "prompt"),
    ("/v1/completions", '{"prompt": ["ok", %s]}', "prompt[1]"),
    ("/v1/completions", '{"prompt": "hi", "stop": ["x", %s]}', "stop[1]"),
    ("/v1/completions", '{"prompt": "hi", "stop_regex": [%s]}', "stop_regex[0]"),
    ("/v1/completions", '{"prompt": "hi", "request_id": %s}', "request_id"),
    ("/v1/completions", '{"prompt": "hi", "model": %s}', "model"),
    ("/v1/completions", '{"prompt": "hi", "user": %s}', "user"),
    ("/v1/completions", '{"prompt": "hi", "bad_words": [%s]}', "bad_words[0]"),
    ("/v1/completions", '{"prompt": "hi", "unknown_field": {"deep": [%s]}}', "unknown_field.deep[0]"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": %s}]}', "messages[0].content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi", "name": %s}]}', "messages[0].name"),
    ("/v1/chat/completions", CHAT % '"chat_template": %s', "chat_template"),
    ("/v1/chat/completions", CHAT % '"chat_template_kwargs": {"x": %s}', "chat_template_kwargs.x"),
    (
        "/v1/chat/completions",
        CHAT % '"tools": [{"type": "function", "function": {"name": %s}}]',
        "tools[0].function.name",
    ),
    ("/v1/chat/completions", CHAT % '"response_format": {"type": "regex", "regex": %s}', "response_format.regex"),
    ("/generate", '{"text": %s}', "text"),
    ("/generate", '{"text": "hi", "rid": %s}', "rid"),
    ("/generate", '{"text": "hi", "sampling_params": {"stop": %s}}', "sampling_params.stop"),
    ("/tokenize", '{"prompt": %s}', "prompt"),
    ("/tokenize", '{"messages": [{"role": "user", "content": %s}]}', "messages[0].content"),
    ("/detokenize", '{"tokens": [1], "model": %s}', "model"),
]


@pytest.mark.parametrize(("route", "template", "field"), CASES)
async def test_a_lone_surrogate_is_a_400_naming_the_field(
    client: httpx.AsyncClient, fake_router: FakeRouter, route: str, template: str, field: str
) -> None:
    reply = await client.post(route, content=template % BAD, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field
    assert f"'{field}' is not valid Unicode" in error["message"]
    assert fake_router.requests == [] and fake_router.tokenize_requests == []


async def test_raw_utf8_encoded_surrogates_are_refused_too(client: httpx.AsyncClient) -> None:
    # Bytes ED A0 80 are a surrogate encoded as UTF-8; Python's json decodes them with surrogatepass.
    body = b'{"prompt": "a\xed\xa0\x80b"}'
    reply = await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "prompt"


async def test_a_surrogate_in_a_key_is_refused(client: httpx.AsyncClient) -> None:
    body = '{"prompt": "hi", "stream_options": {' + BAD + ": 1}}"
    reply = await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "stream_options.<key>"


async def test_valid_non_ascii_text_and_escaped_pairs_pass(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    # An escaped surrogate pair is one valid character (U+1F600).
    body = '{"prompt": "é 漢字 \\ud83d\\ude00", "max_tokens": 2}'
    reply = await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 200, reply.text
    assert fake_router.requests[0].text == "é 漢字 😀"


def test_the_walk_names_the_first_bad_string_in_document_order() -> None:
    assert invalid_text_path({"a": ["ok", {"b": "\udc00"}], "c": "\ud800"}) == "a[1].b"
    assert invalid_text_path("\ud800") == ""
    assert invalid_text_path({"a": [1, 2.5, None, True, "fine"]}) is None
    # Lists of numbers (token ids) are passed over whole; a list with text in it is still read.
    assert invalid_text_path({"input_ids": list(range(5000)), "stop": [3, 4.5, "\ud800"]}) == "stop[2]"
    assert invalid_text_path([[1, 2], [3, [None, "\udfff"]]]) == "[1][1][1]"
    nested: object = "\ud800"
    for _ in range(10_000):
        nested = [nested]
    assert invalid_text_path(nested) == "[0]" * 10_000
