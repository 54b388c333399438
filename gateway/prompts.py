"""What responses show of the prompt itself: its text (OpenAI `echo`) and its first token.

The router returns prompt logprobs from position 1 on: the first token has no
logprob, nothing comes before it. The APIs that list the prompt from position
0 show that token with a null logprob, so its id (and text) is looked up
here: from the request's ids, else by encoding the text as the router does;
then `truncate_prompt_tokens` is applied as the router applies it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.router_client import RouterClient
from turnout.v1 import common_pb2, inference_pb2


@dataclass(frozen=True)
class Prompt:
    """One prompt as a response shows it."""

    # The prompt's text; empty unless it was asked for.
    text: str = ""
    # The prompt's first token (no logprob), when the response lists the prompt from position 0.
    first: common_pb2.TokenLogprob | None = None


async def look_up(
    client: RouterClient, request: inference_pb2.GenerateRequest, *, text: bool, first: bool, first_text: bool
) -> Prompt:
    """The prompt's text if `text`; its first token if `first`, with its text if `first_text`."""
    prompt_text = await _text(client, request) if text else ""
    token = await _first_token(client, request, first_text) if first else None
    return Prompt(prompt_text, token)


def starts_at_zero(request: inference_pb2.GenerateRequest) -> bool:
    """Whether the response lists the prompt's logprobs from its first token."""
    options = request.logprob_options
    return options.HasField("logprob_start_len") and options.logprob_start_len == 0


async def _text(client: RouterClient, request: inference_pb2.GenerateRequest) -> str:
    """A token-id prompt decoded with its special tokens and nothing between them, as vLLM echoes it
    (`tokenizer.decode(ids)`): the echoed prompt's logprob tokens are these pieces, so the text is
    them joined and their text offsets agree with it."""
    if request.WhichOneof("input") == "text":
        return request.text
    ids = _truncated(list(request.input_ids.ids), request.sampling_params)
    return await client.detokenize(request.model, ids, skip_special_tokens=False, spaces_between_special_tokens=False)


async def _first_token(
    client: RouterClient, request: inference_pb2.GenerateRequest, with_text: bool
) -> common_pb2.TokenLogprob | None:
    if request.WhichOneof("input") == "text":
        special = request.add_special_tokens if request.HasField("add_special_tokens") else None
        ids = await client.tokenize(request.model, request.text, special)
    else:
        ids = list(request.input_ids.ids)
    ids = _truncated(ids, request.sampling_params)
    if not ids:
        return None  # an empty prompt: the engine refuses it anyway
    token = common_pb2.TokenLogprob(token_id=ids[0])
    if with_text:
        # As vLLM and SGLang decode logprob tokens: special tokens shown.
        token.text = await client.detokenize(request.model, ids[:1], skip_special_tokens=False)
    return token


def _truncated(ids: list[int], sampling: common_pb2.SamplingParams) -> list[int]:
    keep = sampling.truncate_prompt_tokens if sampling.HasField("truncate_prompt_tokens") else 0
    return ids[-keep:] if 0 < keep < len(ids) else ids
