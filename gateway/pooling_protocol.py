"""JSON bodies of the pooling routes: `/v1/embeddings`, `/pooling`, `/score`, `/rerank` (vLLM, OpenAI,
Jina/Cohere spellings). The policy of `protocol` holds: types are checked here, values by the engine
(`dimensions` over the hidden size is the engine's 400); fields peers document that we cannot
honour are declared and refused by `pooling` with a 400 naming them."""

from __future__ import annotations

from typing import Any, Literal

from gateway.protocol import I32, U32, _Body

# A prompt: text, or token ids.
Prompt = str | list[U32]


class PoolingFields(_Body):
    """What every pooling route takes besides its inputs."""

    model: str | None = None
    user: str | None = None
    # vLLM: keep only the prompt's last N tokens (-1: as many as the context holds; unset: all, a longer
    # prompt is refused).
    truncate_prompt_tokens: I32 | None = None
    add_special_tokens: bool | None = None
    priority: I32 | None = None
    # vLLM's pooling parameter with no effect on the result.
    additional_data: Any = None
    # Turnout: which positions are pooled (vLLM's pooler config `pooling_type`): LAST (default), MEAN,
    # CLS (the first position). Any case.
    pooling_type: str | None = None
    request_id: str | None = None


class EmbeddingRequest(PoolingFields):
    # One string, a list of strings, one token id list, or a list of token id lists.
    input: str | list[str] | list[U32] | list[list[U32]]
    encoding_format: Literal["float", "base64"] = "float"
    # Matryoshka: keep the first `dimensions` values, then normalise.
    dimensions: U32 | None = None
    # vLLM: L2-normalise the vector (default true).
    normalize: bool | None = None
    # vLLM: the element type of a base64 vector.
    embed_dtype: str | None = None
    # vLLM's chat-style input and its options: declared so they are refused by name.
    messages: Any = None
    chat_template: Any = None
    chat_template_kwargs: Any = None


class ScoreRequest(PoolingFields):
    """vLLM `/score`: text_1 paired with text_2 (one with many, or pairwise)."""

    text_1: str | list[str]
    text_2: str | list[str]
    # Accepted as vLLM does (scores are always plain numbers).
    encoding_format: Literal["float"] | None = None


class RerankDocument(_Body):
    text: str


class RerankRequest(PoolingFields):
    """Jina / Cohere rerank: one query against many documents."""

    query: str
    documents: list[str | RerankDocument]
    # The best `top_n` results; unset or 0: all.
    top_n: U32 | None = None
    # Include each document's text in its result (default true, as vLLM).
    return_documents: bool | None = None
    # Cohere: accepted, nothing to chunk.
    max_chunks_per_doc: U32 | None = None
