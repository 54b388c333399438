"""Log-probabilities as each API shows them: OpenAI completions and chat, vLLM `prompt_logprobs`, SGLang `meta_info`.

Input is the contract's `PositionLogprobs`: `token` is the token at the
position (sampled, or given in the prompt), `top` its most likely
alternatives (most likely first), `requested` the `token_ids_logprob`
entries. A prompt's first token has no logprob; where it is listed, it comes
as a bare `TokenLogprob` (`first`) and shows a null logprob.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from turnout.v1 import common_pb2

Position = common_pb2.PositionLogprobs
Token = common_pb2.TokenLogprob

# OpenAI and vLLM show -inf (a token that cannot be sampled) as this: JSON has no infinity.
_OPENAI_FLOOR = -9999.0


def _openai_logprob(logprob: float) -> float:
    return logprob if logprob >= _OPENAI_FLOOR else _OPENAI_FLOOR  # NaN too


def _text(token: Token) -> str:
    if token.HasField("text"):
        return token.text
    return token.token_bytes.decode("utf-8", errors="replace")


def token_string(token: Token, as_token_ids: bool) -> str:
    """The token as OpenAI responses show it; vLLM's `return_tokens_as_token_ids` makes it "token_id:{id}"."""
    return f"token_id:{token.token_id}" if as_token_ids else _text(token)


def completion_logprobs(
    positions: Sequence[Position],
    *,
    top_n: int,
    as_token_ids: bool,
    offset: int = 0,
    first: Token | None = None,
) -> dict[str, list[Any]]:
    """A completions choice's `logprobs`; `offset` is where the first token starts in the choice's text.

    Each `top_logprobs` entry holds the `top_n` alternatives and the sampled
    token (OpenAI: "up to logprobs + 1 elements"), the sampled one first as in vLLM.
    """
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []

    def add(token: str, logprob: float | None, top: dict[str, float] | None) -> None:
        nonlocal offset
        tokens.append(token)
        token_logprobs.append(logprob)
        top_logprobs.append(top)
        text_offset.append(offset)
        offset += len(token)

    if first is not None:
        add(token_string(first, as_token_ids), None, None)
    for position in positions:
        token = token_string(position.token, as_token_ids)
        logprob = _openai_logprob(position.token.logprob)
        top = {token: logprob}
        top.update((token_string(t, as_token_ids), _openai_logprob(t.logprob)) for t in position.top[:top_n])
        add(token, logprob, top)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


def chat_logprobs(positions: Sequence[Position], *, top_n: int, as_token_ids: bool) -> dict[str, Any]:
    """A chat choice's (or delta's) `logprobs`: `{"content": [...]}` with each token's UTF-8 bytes."""
    return {
        "content": [
            {
                **_chat_token(position.token, as_token_ids),
                "top_logprobs": [_chat_token(t, as_token_ids) for t in position.top[:top_n]],
            }
            for position in positions
        ]
    }


def _chat_token(token: Token, as_token_ids: bool) -> dict[str, Any]:
    shown = token_string(token, as_token_ids)
    # A token's own bytes may be part of a UTF-8 character: the reason `bytes` exists.
    raw = token.token_bytes if token.HasField("token_bytes") and not as_token_ids else shown.encode()
    return {"token": shown, "logprob": _openai_logprob(token.logprob), "bytes": list(raw)}


def prompt_logprobs(positions: Sequence[Position], top_n: int) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs` for positions 1.. of a prompt: null for the first token, then by token id
    the prompt's own token and the `top_n` alternatives."""
    rows: list[dict[str, dict[str, Any]] | None] = [None]
    for position in positions:
        row = {str(position.token.token_id): _vllm_entry(position.token)}
        for t in position.top[:top_n]:
            row.setdefault(str(t.token_id), _vllm_entry(t))
        rows.append(row)
    return rows


def _vllm_entry(token: Token) -> dict[str, Any]:
    text = token.text if token.HasField("text") else None
    return {"logprob": _openai_logprob(token.logprob), "rank": token.rank, "decoded_token": text}


def sglang_logprobs(
    output: Sequence[Position],
    prompt: Sequence[Position],
    first: Token | None,
    options: common_pb2.LogprobOptions,
) -> dict[str, Any]:
    """SGLang's logprob fields of `meta_info`: `[logprob, token_id, text or null]` triples.

    `first` leads the prompt's lists (logprob null; its alternatives null) when
    they start at position 0. Alternatives and requested ids appear only when
    asked for, as in SGLang; a non-finite logprob is null (SGLang's JSON encoder).
    """
    with_text = options.return_text_in_logprobs

    def triple(token: Token, known: bool = True) -> list[Any]:
        logprob = token.logprob if known and math.isfinite(token.logprob) else None
        return [logprob, token.token_id, token.text if with_text and token.HasField("text") else None]

    def group(tokens: Sequence[Token]) -> list[list[Any]] | None:
        return [triple(t) for t in tokens] or None

    lead: list[Token] = [first] if first is not None else []
    meta: dict[str, Any] = {
        "input_token_logprobs": [triple(t, known=False) for t in lead] + [triple(p.token) for p in prompt],
        "output_token_logprobs": [triple(p.token) for p in output],
    }
    if options.top_logprobs_num > 0:
        meta["input_top_logprobs"] = [None] * len(lead) + [group(p.top) for p in prompt]
        meta["output_top_logprobs"] = [group(p.top) for p in output]
    if options.token_ids_logprob:
        meta["input_token_ids_logprobs"] = [None] * len(lead) + [group(p.requested) for p in prompt]
        meta["output_token_ids_logprobs"] = [group(p.requested) for p in output]
    return meta
