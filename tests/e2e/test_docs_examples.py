"""Every `curl` example of docs/structured-outputs.md and docs/reasoning.md, run as printed.

structured-outputs.md promises its examples run against `make serve` (the default model);
reasoning.md's need a model with thinking tokens, so they run against the tiny thinking model
served with a reasoning parser."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

DOCS = Path(__file__).resolve().parents[2] / "docs"
_CURL = re.compile(
    r"```bash\ncurl (?:-N )?http://127\.0\.0\.1:8000(?P<path>/\S+) -H 'Content-Type: application/json' "
    r"-d '(?P<body>.*?)'\n```",
    re.S,
)


def examples(name: str) -> list[tuple[str, dict[str, Any]]]:
    text = (DOCS / name).read_text()
    found = [(m["path"], json.loads(m["body"])) for m in _CURL.finditer(text)]
    assert len(found) == text.count("```bash\ncurl"), f"a curl example of {name} does not parse"
    return found


def _post(stack: Stack, path: str, body: dict[str, Any]) -> Any:
    if body.get("stream"):
        events = []
        with httpx.stream("POST", stack.base_url + path, json=body, timeout=180) as reply:
            assert reply.status_code == 200, reply.read()
            for line in reply.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[6:]))
        return events
    reply = httpx.post(stack.base_url + path, json=body, timeout=180)
    assert reply.status_code == 200, reply.text
    return reply.json()


STRUCTURED = examples("structured-outputs.md")


@pytest.mark.default_model
@pytest.mark.parametrize(("path", "body"), STRUCTURED, ids=[f"example{i}" for i in range(len(STRUCTURED))])
def test_structured_outputs_examples(default_stack: Stack, path: str, body: dict[str, Any]) -> None:
    out = _post(default_stack, path, body)
    if body.get("stream"):
        calls = [d for e in out if e["choices"] for d in e["choices"][0]["delta"].get("tool_calls") or []]
        assert calls and calls[0]["function"]["name"]
        return
    if path == "/generate":
        text = out["text"]
    elif path == "/v1/completions":
        text = out["choices"][0]["text"]
    else:
        message = out["choices"][0]["message"]
        text = message["content"]
    fmt = body.get("response_format", {})
    if fmt.get("type") == "json_schema":
        jsonschema.validate(json.loads(text), fmt["json_schema"]["schema"])
    if fmt.get("type") == "json_object":
        assert isinstance(json.loads(text), dict)
    if "structured_outputs" in body and "regex" in body["structured_outputs"]:
        assert re.fullmatch(body["structured_outputs"]["regex"], text)
    if "guided_choice" in body:
        assert text in body["guided_choice"]
    if "json_schema" in body.get("sampling_params", {}):
        jsonschema.validate(json.loads(text), json.loads(body["sampling_params"]["json_schema"]))
    if isinstance(body.get("tool_choice"), dict):
        (call,) = message["tool_calls"]
        schema = body["tools"][0]["function"]["parameters"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema)


REASONING = examples("reasoning.md")


@pytest.mark.parametrize(("path", "body"), REASONING, ids=[f"example{i}" for i in range(len(REASONING))])
def test_reasoning_examples(thinking_stack: Stack, path: str, body: dict[str, Any]) -> None:
    out = _post(thinking_stack, path, body)
    if path == "/generate":
        token_id = body["sampling_params"]["custom_params"]["token_id"]
        assert out["output_ids"] == [token_id] * body["sampling_params"]["max_new_tokens"]
        return
    message = out["choices"][0]["message"]
    assert message.get("reasoning_content"), message
    assert out["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
