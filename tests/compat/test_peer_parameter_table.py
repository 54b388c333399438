"""docs/api.md's table of every peer parameter ("Every peer parameter, one by one"), walked
against a live stack: each row's example gets the answer the row states, every parameter the
peers' documents name has its row, and no parameter the table calls supported is one the gateway
would accept and ignore."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from gateway.pooling_protocol import EmbeddingRequest, RerankRequest, ScoreRequest
from gateway.protocol import ChatCompletionRequest, CompletionRequest, NativeGenerateRequest, NativeSamplingParams
from tests.compat.conftest import MODEL
from tests.compat.peer_parameters import PEER_PARAMETERS
from tests.compat.peer_reference import REFERENCE_DIR, extract
from tests.e2e.stack import Stack

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
SAMPLING_PARAMS = "/generate sampling_params"

# The body each row's example is merged into, and the request model that declares the route's fields.
BASES: dict[str, tuple[dict[str, Any], type[BaseModel]]] = {
    "/v1/completions": ({"model": MODEL, "prompt": "Hi", "max_tokens": 2}, CompletionRequest),
    "/v1/chat/completions": (
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        ChatCompletionRequest,
    ),
    "/generate": ({"text": "Hi", "sampling_params": {"max_new_tokens": 2}}, NativeGenerateRequest),
    SAMPLING_PARAMS: ({"text": "Hi", "sampling_params": {"max_new_tokens": 2}}, NativeSamplingParams),
    "/v1/embeddings": ({"model": MODEL, "input": "Hi"}, EmbeddingRequest),
    "/pooling": ({"model": MODEL, "input": "Hi"}, EmbeddingRequest),
    "/score": ({"model": MODEL, "text_1": "Hi", "text_2": "Ho"}, ScoreRequest),
    "/rerank": ({"model": MODEL, "query": "Hi", "documents": ["Ho"]}, RerankRequest),
}

ROW = re.compile(
    r'^\| `(?P<route>[^`]+)` \| `(?P<name>[^`]+)` \| `(?P<example>[^`]+)` \| (?P<outcome>200|400 "(?P<message>.*)") \|'
)


@dataclass(frozen=True)
class Row:
    route: str
    name: str
    example: dict[str, Any]
    status: int
    message: str

    def request(self) -> tuple[str, dict[str, Any]]:
        """The path and body this row sends."""
        body = copy.deepcopy(BASES[self.route][0])
        if self.route == SAMPLING_PARAMS:
            body["sampling_params"].update(self.example)
            return "/generate", body
        return self.route, {**body, **self.example}


def table_rows() -> list[Row]:
    text = API_DOC.read_text(encoding="utf-8")
    section = text.split("### Every peer parameter, one by one", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            status = int(match["outcome"][:3])
            example = json.loads(match["example"])
            rows.append(Row(match["route"], match["name"], example, status, match["message"] or ""))
    return rows


ROWS = table_rows()

ROUTE_ROW = re.compile(
    r"^\| `(?P<method>GET|POST) (?P<path>/[^`]*)` \| (?:`(?P<example>[^`]*)` )?\| "
    r'(?P<outcome>200|400 "(?P<message>.*)") \|$'
)
# The routes issue 13 found a vLLM or SGLang client calling that answered 404.
ISSUE_ROUTES = {
    "/v1/responses",
    "/v1/score",
    "/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/v1/embeddings",
    "/pooling",
    "/tokenizer_info",
    "/load",
    "/invocations",
    "/v1/audio/transcriptions",
}


@dataclass(frozen=True)
class RouteRow:
    method: str
    path: str
    example: dict[str, Any] | None
    status: int
    message: str


def route_rows() -> list[RouteRow]:
    text = API_DOC.read_text(encoding="utf-8")
    section = text.split("### Every peer route", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        match = ROUTE_ROW.match(line)
        if match:
            example = json.loads(match["example"]) if match["example"] else None
            rows.append(
                RouteRow(match["method"], match["path"], example, int(match["outcome"][:3]), match["message"] or "")
            )
    return rows


ROUTES = route_rows()


def test_the_table_has_a_row_for_every_parameter_the_peer_documents_name() -> None:
    listed = {(row.route, row.name) for row in ROWS}
    documented = [(route, name) for route in BASES for name in PEER_PARAMETERS.get(route, [])]
    missing = [pair for pair in documented if pair not in listed]
    assert not missing, f"parameters of the peer documents without a row in docs/api.md: {missing}"
    assert len(listed) == len(ROWS), "a (route, parameter) has two rows"


def test_every_peer_route_has_a_row_and_a_refused_one_refuses_its_parameters() -> None:
    by_path = {row.path: row for row in ROUTES}
    documented = {route for route in PEER_PARAMETERS if route != SAMPLING_PARAMS}
    missing = sorted((documented | ISSUE_ROUTES) - by_path.keys())
    assert not missing, f"routes without a row in docs/api.md's 'Every peer route': {missing}"
    for route, names in PEER_PARAMETERS.items():
        # A route without its own parameter rows is one that has no parameters or refuses them all.
        if route not in BASES and names:
            assert by_path[route].status == 400, f"{route}: its parameters {names} have no rows and it is not refused"


@pytest.mark.parametrize("row", ROUTES, ids=[f"{row.method} {row.path}" for row in ROUTES])
def test_the_stack_answers_each_route_as_the_table_says(compat_stack: Stack, row: RouteRow) -> None:
    body = None if row.example is None else {"model": MODEL, **row.example}
    reply = httpx.request(row.method, f"{compat_stack.base_url}{row.path}", json=body, timeout=300)
    assert reply.status_code == row.status, reply.text
    if row.status == 400:
        assert reply.json()["error"]["message"] == row.message


def test_the_committed_parameter_list_is_what_the_documents_say() -> None:
    if not REFERENCE_DIR.is_dir():
        pytest.skip(f"the peer documents are not at {REFERENCE_DIR} (a clone without shared/)")
    assert extract(REFERENCE_DIR) == PEER_PARAMETERS, "run peer_reference.py again (see its docstring)"


def test_every_parameter_the_table_calls_supported_is_declared() -> None:
    """An undeclared field is accepted and ignored (docs/api.md's unknown-field policy): a peer's
    parameter must never be one of those."""
    for row in ROWS:
        if row.status == 200:
            model = BASES[row.route][1]
            assert row.name in model.model_fields, f"{row.route} {row.name}: supported in the table, not declared"


@pytest.mark.parametrize("row", ROWS, ids=[f"{row.route} {row.name}" for row in ROWS])
def test_the_stack_answers_as_the_table_says(compat_stack: Stack, row: Row) -> None:
    path, body = row.request()
    reply = httpx.post(f"{compat_stack.base_url}{path}", json=body, timeout=300)
    assert reply.status_code == row.status, reply.text
    if row.status == 400:
        assert reply.json()["error"]["message"] == row.message
