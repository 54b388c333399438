"""Structured outputs through all four real services: the output always satisfies its constraint
(JSON schema checked with `jsonschema`, regex fullmatch, EBNF, choice), with n > 1, streaming and a
mixed batch, on the default model and on a tiny random model (where only the grammar makes the
output valid); bad constraints are 400s."""

from __future__ import annotations

import concurrent.futures
import json
import re
from typing import Any

import httpx
import jsonschema
import pytest

from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
        "capital": {"type": "boolean"},
    },
    "required": ["name", "population", "capital"],
    "additionalProperties": False,
}
PERSON = {
    "type": "object",
    "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "mood": {"enum": ["happy", "sad"]},
    },
    "required": ["age", "mood"],
    "additionalProperties": False,
}
DATE = "20[0-9]{2}-[01][0-9]-[0-3][0-9]"
GREETING_EBNF = 'root ::= ("Hello" | "Hi") ", " name "!"\nname ::= [A-Z] [a-z]{1,8}'
CHAT = [{"role": "user", "content": "Give me a city as JSON."}]


def chat(http: httpx.Client, **body: Any) -> dict[str, Any]:
    reply = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 96, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def valid_json(text: str, schema: dict[str, Any]) -> Any:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


@pytest.fixture(scope="module")
def http(default_stack: Stack) -> httpx.Client:
    return httpx.Client(base_url=default_stack.base_url, timeout=120)


@pytest.fixture(scope="module")
def tiny(tiny_stack: Stack) -> httpx.Client:
    return httpx.Client(base_url=tiny_stack.base_url, timeout=120)


@pytest.mark.default_model
def test_json_schema_with_n_and_a_seed(http: httpx.Client) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    out = chat(http, response_format=fmt, n=3, temperature=0.9, seed=7)
    assert len(out["choices"]) == 3
    for choice in out["choices"]:
        assert choice["finish_reason"] == "stop", choice
        valid_json(choice["message"]["content"], CITY)


@pytest.mark.default_model
def test_json_schema_streamed(http: httpx.Client) -> None:
    body = {"messages": CHAT, "max_tokens": 96, "stream": True, "guided_json": CITY, "temperature": 0.7, "seed": 3}
    text = ""
    finish = []
    with http.stream("POST", "/v1/chat/completions", json=body) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                text += choice["delta"].get("content") or ""
                finish.append(choice["finish_reason"])
    valid_json(text, CITY)
    assert [f for f in finish if f] == ["stop"]


@pytest.mark.default_model
def test_json_object_regex_choice_and_ebnf(http: httpx.Client) -> None:
    # Free-form JSON can run on until max_tokens; greedy on this prompt closes its object.
    ask = [{"role": "user", "content": "Give me a JSON object with the name and age of a cat."}]
    body = {"messages": ask, "response_format": {"type": "json_object"}, "max_tokens": 256, "temperature": 0}
    obj = chat(http, **body)["choices"][0]
    assert obj["finish_reason"] == "stop", obj
    assert isinstance(json.loads(obj["message"]["content"]), dict)

    reply = http.post(
        "/v1/completions",
        json={"prompt": "Today is ", "max_tokens": 16, "structured_outputs": {"regex": DATE}, "temperature": 0.8},
    )
    assert reply.status_code == 200, reply.text
    assert re.fullmatch(DATE, reply.json()["choices"][0]["text"])

    answer = chat(http, guided_choice=["yes", "no"], temperature=1.0, seed=1)["choices"][0]["message"]["content"]
    assert answer in ("yes", "no")

    reply = http.post(
        "/generate", json={"text": "A greeting: ", "sampling_params": {"max_new_tokens": 32, "ebnf": GREETING_EBNF}}
    )
    assert reply.status_code == 200, reply.text
    assert re.fullmatch(r"(Hello|Hi), [A-Z][a-z]{1,8}!", reply.json()["text"])


@pytest.mark.default_model
def test_compact_json_without_whitespace(http: httpx.Client) -> None:
    body = {"structured_outputs": {"json": PERSON, "disable_any_whitespace": True}, "temperature": 0.8, "seed": 5}
    text = chat(http, **body)["choices"][0]["message"]["content"]
    valid_json(text, PERSON)
    assert text == json.dumps(json.loads(text), separators=(",", ":"))


@pytest.mark.default_model
def test_mixed_batch_of_40(http: httpx.Client) -> None:
    """20 constrained and 20 unconstrained requests at once: every constrained one validates and
    the unconstrained ones are free text (the engine tests check they equal their solo output)."""
    prompts = [f"Write one sentence about the number {i}." for i in range(20)]

    def plain(prompt: str) -> str:
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
        reply = http.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["text"]  # type: ignore[no-any-return]

    def constrained(i: int) -> str:
        schema = CITY if i % 2 else PERSON
        body = {"prompt": prompts[i], "max_tokens": 96, "guided_json": schema, "temperature": 0.8, "seed": i}
        reply = http.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["text"]  # type: ignore[no-any-return]

    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        plain_jobs = [pool.submit(plain, p) for p in prompts]
        json_jobs = [pool.submit(constrained, i) for i in range(20)]
        plain_out = [job.result() for job in plain_jobs]
        json_out = [job.result() for job in json_jobs]
    assert sum(bool(text.strip()) for text in plain_out) >= 10
    assert sum(text.lstrip().startswith("{") for text in plain_out) < 20
    for i, text in enumerate(json_out):
        valid_json(text, CITY if i % 2 else PERSON)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"guided_json": {"type": "object", "properties": {"a": {"type": "frob"}}}}, "json"),
        ({"guided_regex": "(unclosed"}, "regex"),
        ({"guided_grammar": "root ::= undefined_rule"}, "undefined_rule"),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "only one"),
    ],
)
def test_bad_constraints_are_400(tiny: httpx.Client, body: dict[str, Any], words: str) -> None:
    reply = tiny.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, **body})
    assert reply.status_code == 400, reply.text
    assert words in reply.json()["error"]["message"].lower()
    # The stack keeps serving.
    assert tiny.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


def test_random_weights_still_give_valid_json(tiny: httpx.Client) -> None:
    """A random model writes garbage; only the grammar can make every output valid."""
    for seed in range(4):
        body = {"prompt": "x", "max_tokens": 200, "guided_json": PERSON, "temperature": 1.0, "seed": seed, "n": 2}
        reply = tiny.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        for choice in reply.json()["choices"]:
            assert choice["finish_reason"] == "stop", choice
            valid_json(choice["text"], PERSON)
    reply = tiny.post("/v1/completions", json={"prompt": "x", "max_tokens": 24, "guided_regex": DATE, "seed": 1})
    assert re.fullmatch(DATE, reply.json()["choices"][0]["text"])
