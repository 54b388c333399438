"""Embeddings, pooling, score and rerank through all four real services, with the official openai
client, LangChain and plain HTTP. The tiny random model makes no semantic sense, so the checks are
identities: the same text gives the same vector however it is sent, truncation to `dimensions`
is the full vector's prefix renormalised, score(a, a) is 1 and symmetric, rerank follows the scores."""

from __future__ import annotations

import base64
import math

import httpx
import numpy as np
import openai
import pytest

from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

TEXTS = ["The capital of France is Paris.", "Horses and cows are both animals", "1 + 1 = 2"]


@pytest.fixture(scope="module")
def client(tiny_stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny_stack.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(tiny_stack: Stack) -> httpx.Client:
    return httpx.Client(base_url=tiny_stack.base_url, timeout=60)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def close(a: list[float], b: list[float], tol: float = 1e-5) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) <= tol


def test_single_string_gives_one_unit_vector_and_usage(client: openai.OpenAI, model: str, http: httpx.Client) -> None:
    reply = client.embeddings.create(model=model, input=TEXTS[0])
    assert reply.object == "list" and reply.model == model and len(reply.data) == 1
    item = reply.data[0]
    assert item.object == "embedding" and item.index == 0
    assert len(item.embedding) == 64  # the tiny model's hidden size
    assert norm(item.embedding) == pytest.approx(1.0, abs=1e-4)
    ids = http.post("/tokenize", json={"model": model, "prompt": TEXTS[0]}).json()["tokens"]
    assert reply.usage.prompt_tokens == len(ids) == reply.usage.total_tokens


def test_batch_equals_singles_and_token_ids_equal_text(client: openai.OpenAI, model: str, http: httpx.Client) -> None:
    batch = client.embeddings.create(model=model, input=TEXTS)
    assert [d.index for d in batch.data] == [0, 1, 2]
    for text, item in zip(TEXTS, batch.data, strict=True):
        single = client.embeddings.create(model=model, input=text).data[0].embedding
        assert close(single, item.embedding)
    ids = [http.post("/tokenize", json={"model": model, "prompt": t}).json()["tokens"] for t in TEXTS]
    by_ids = client.embeddings.create(model=model, input=ids)
    one_list = client.embeddings.create(model=model, input=ids[0])
    assert close(by_ids.data[1].embedding, batch.data[1].embedding)
    assert close(one_list.data[0].embedding, batch.data[0].embedding) and len(one_list.data) == 1
    assert batch.usage.prompt_tokens == sum(len(i) for i in ids)


def test_base64_decodes_to_the_float_vector(client: openai.OpenAI, model: str, http: httpx.Client) -> None:
    # Without encoding_format the openai client asks for base64 itself and decodes it: that is `floats`.
    floats = client.embeddings.create(model=model, input=TEXTS[1]).data[0].embedding
    raw = http.post("/v1/embeddings", json={"model": model, "input": TEXTS[1]}).json()["data"][0]["embedding"]
    assert close(floats, raw)
    # Asked for explicitly, the client hands the string over as it came.
    encoded = client.embeddings.create(model=model, input=TEXTS[1], encoding_format="base64").data[0].embedding
    assert isinstance(encoded, str)
    assert close(np.frombuffer(base64.b64decode(encoded), dtype="<f4").tolist(), floats)


def test_dimensions_truncate_then_renormalise(client: openai.OpenAI, model: str) -> None:
    full = client.embeddings.create(model=model, input=TEXTS[2], extra_body={"normalize": False}).data[0].embedding
    short = client.embeddings.create(model=model, input=TEXTS[2], dimensions=16).data[0].embedding
    assert len(short) == 16
    prefix = full[:16]
    assert close(short, [x / norm(prefix) for x in prefix], tol=1e-4)
    assert norm(full) != pytest.approx(1.0, abs=1e-3), "normalize false leaves the raw hidden state"


def test_pooling_types_differ_and_mean_is_unit(client: openai.OpenAI, model: str) -> None:
    def embed(kind: str) -> list[float]:
        return (
            client.embeddings.create(model=model, input=TEXTS[0], extra_body={"pooling_type": kind}).data[0].embedding
        )

    last, mean, cls = embed("last"), embed("MEAN"), embed("cls")
    assert close(last, client.embeddings.create(model=model, input=TEXTS[0]).data[0].embedding)
    assert not close(last, mean, tol=1e-3) and not close(mean, cls, tol=1e-3)
    assert norm(mean) == pytest.approx(1.0, abs=1e-4)


def test_langchain_openai_embeddings(tiny_stack: Stack, model: str, client: openai.OpenAI) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    embedder = langchain_openai.OpenAIEmbeddings(
        model=model, base_url=f"{tiny_stack.base_url}/v1", api_key="unused", check_embedding_ctx_length=False
    )
    docs = embedder.embed_documents(TEXTS[:2])
    query = embedder.embed_query(TEXTS[0])
    assert len(docs) == 2 and len(query) == 64
    assert close(query, client.embeddings.create(model=model, input=TEXTS[0]).data[0].embedding, tol=1e-4)
    assert close(docs[1], client.embeddings.create(model=model, input=TEXTS[1]).data[0].embedding, tol=1e-4)


def test_pooling_route_returns_the_embedding_vector(http: httpx.Client, client: openai.OpenAI, model: str) -> None:
    reply = http.post("/pooling", json={"model": model, "input": [TEXTS[0], TEXTS[1]]})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "list" and [d["object"] for d in body["data"]] == ["pooling", "pooling"]
    assert close(body["data"][1]["data"], client.embeddings.create(model=model, input=TEXTS[1]).data[0].embedding)


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_is_cosine_similarity(http: httpx.Client, client: openai.OpenAI, model: str, path: str) -> None:
    same = http.post(path, json={"model": model, "text_1": TEXTS[0], "text_2": TEXTS[0]}).json()
    assert same["object"] == "list" and same["data"][0]["object"] == "score"
    assert same["data"][0]["score"] == pytest.approx(1.0, abs=1e-5)
    one_to_many = http.post(path, json={"model": model, "text_1": TEXTS[0], "text_2": TEXTS[1:]}).json()
    flipped = http.post(path, json={"model": model, "text_1": TEXTS[1:], "text_2": [TEXTS[0], TEXTS[0]]}).json()
    scores = [d["score"] for d in one_to_many["data"]]
    assert [d["index"] for d in one_to_many["data"]] == [0, 1]
    assert scores == pytest.approx([d["score"] for d in flipped["data"]], abs=1e-6)  # symmetric
    vectors = [d.embedding for d in client.embeddings.create(model=model, input=TEXTS).data]
    assert scores[0] == pytest.approx(float(np.dot(vectors[0], vectors[1])), abs=1e-4)
    assert one_to_many["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_orders_by_score(http: httpx.Client, model: str, path: str) -> None:
    query, documents = TEXTS[0], [TEXTS[1], TEXTS[0], TEXTS[2]]
    reply = http.post(path, json={"model": model, "query": query, "documents": documents})
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    scores = http.post("/score", json={"model": model, "text_1": query, "text_2": documents}).json()["data"]
    expected = sorted(range(3), key=lambda i: -scores[i]["score"])
    assert [r["index"] for r in results] == expected and expected[0] == 1  # the query itself ranks first
    assert [r["relevance_score"] for r in results] == pytest.approx([scores[i]["score"] for i in expected], abs=1e-6)
    assert results[0]["document"] == {"text": TEXTS[0]}
    top = http.post(
        path, json={"model": model, "query": query, "documents": documents, "top_n": 2, "return_documents": False}
    ).json()["results"]
    assert [r["index"] for r in top] == expected[:2] and all("document" not in r for r in top)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/embeddings", {"input": ""}, "input"),
        ("/v1/embeddings", {"input": []}, "input"),
        ("/v1/embeddings", {"input": [[]]}, "input"),
        ("/v1/embeddings", {"input": 5}, "input"),
        ("/v1/embeddings", {"input": ["a", 3]}, "input"),
        ("/v1/embeddings", {"input": "a", "dimensions": 65}, None),
        ("/v1/embeddings", {"input": "a", "dimensions": 0}, None),
        ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ("/v1/embeddings", {"input": "a", "embed_dtype": "fp8_e4m3"}, "embed_dtype"),
        ("/v1/embeddings", {"input": "a", "messages": [{"role": "user", "content": "a"}]}, "messages"),
        ("/v1/embeddings", {"input": "a", "pooling_type": "max"}, "pooling_type"),
        ("/v1/embeddings", {"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ("/v1/embeddings", {"input": "word " * 5000}, None),
        ("/v1/embeddings", {"input": [10**6]}, None),
        ("/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
        ("/score", {"text_1": "a", "text_2": []}, "text_2"),
        ("/score", {"text_1": "", "text_2": "a"}, "text_1"),
        ("/rerank", {"query": "a", "documents": []}, "documents"),
        ("/rerank", {"query": "", "documents": ["a"]}, "query"),
        ("/rerank", {"query": "a", "documents": ["a"], "top_n": -1}, "top_n"),
    ],
)
def test_bad_input_is_a_400(
    http: httpx.Client, model: str, path: str, body: dict[str, object], param: str | None
) -> None:
    reply = http.post(path, json={"model": model, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    if param is not None:
        assert error["param"] == param or param in error["message"], error


def test_too_long_input_names_the_context_and_truncation_fits_it(http: httpx.Client, model: str) -> None:
    long = "word " * 5000
    reply = http.post("/v1/embeddings", json={"model": model, "input": long})
    assert reply.status_code == 400 and "maximum context length" in reply.json()["error"]["message"]
    kept = http.post("/v1/embeddings", json={"model": model, "input": long, "truncate_prompt_tokens": 10}).json()
    assert kept["usage"]["prompt_tokens"] == 10 and len(kept["data"][0]["embedding"]) == 64
    whole = http.post("/v1/embeddings", json={"model": model, "input": long, "truncate_prompt_tokens": -1}).json()
    assert whole["usage"]["prompt_tokens"] == 4096


def test_generate_with_zero_new_tokens_scores_the_prompt(http: httpx.Client, model: str) -> None:
    """SGLang's prefill-only scoring: input logprobs, no output tokens."""
    body = {
        "text": TEXTS[0],
        "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    reply = http.post("/generate", json=body)
    assert reply.status_code == 200, reply.text
    out = reply.json()
    meta = out["meta_info"]
    assert out["output_ids"] == [] and out["text"] == "" and meta["completion_tokens"] == 0
    assert meta["output_token_logprobs"] == [] and meta["finish_reason"] == {"type": "length", "length": 0}
    logprobs = meta["input_token_logprobs"]
    assert len(logprobs) == meta["prompt_tokens"] and logprobs[0][0] is None
    assert all(lp <= 0 for lp, _, _ in logprobs[1:])


def test_hidden_states_on_generate_and_completions(http: httpx.Client, client: openai.OpenAI, model: str) -> None:
    """SGLang's return_hidden_states: the prompt's rows, then one row per decode step; the prompt's last
    row is the raw last-token embedding of the same prompt, and /v1/completions shows the last row."""
    body = {"text": TEXTS[0], "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}
    out = http.post("/generate", json={**body, "return_hidden_states": True}).json()
    meta = out["meta_info"]
    states = meta["hidden_states"]
    assert len(states) == meta["completion_tokens"] == 4
    assert len(states[0]) == meta["prompt_tokens"] and all(len(row) == 64 for row in states[0])
    assert all(len(row) == 64 for row in states[1:])
    raw = client.embeddings.create(model=model, input=TEXTS[0], extra_body={"normalize": False}).data[0].embedding
    assert close(states[0][-1], raw, tol=2e-2 * max(abs(x) for x in raw))
    plain = http.post("/generate", json=body).json()
    assert "hidden_states" not in plain["meta_info"] and plain["output_ids"] == out["output_ids"]
    reply = client.completions.create(
        model=model,
        prompt=TEXTS[0],
        max_tokens=4,
        temperature=0,
        extra_body={"ignore_eos": True, "return_hidden_states": True},
    )
    last = (reply.choices[0].model_extra or {})["hidden_states"]
    assert close(last, states[-1], tol=2e-2 * max(abs(x) for x in states[-1]))


def test_invocations_with_input_is_answered_as_embeddings(http: httpx.Client, model: str) -> None:
    """SageMaker's /invocations sends a body with `input` to /v1/embeddings (vLLM's dispatch)."""
    body = {"model": model, "input": ["Hello", "world"]}
    direct = http.post("/v1/embeddings", json=body)
    invoked = http.post("/invocations", json=body)
    assert direct.status_code == invoked.status_code == 200, invoked.text
    assert [d["embedding"] for d in invoked.json()["data"]] == [d["embedding"] for d in direct.json()["data"]]
