"""Turning a GenerateRequest into what the engine takes: prompt token ids and token-level sampling params.

The engine knows only token ids, so every parameter given as text is encoded
here: the prompt (text or chat), `bad_words` and DRY's sequence breakers.
`truncate_prompt_tokens` keeps the prompt's last tokens, as in vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.router.tokenizer_pool import TokenizerClient
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2, inference_pb2, tokenizer_pb2, tokenizer_pb2_grpc

# Aphrodite's default DRY sequence breakers, used when DRY is on and the request names none.
DEFAULT_DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    # The rendered chat template left a thinking block open: the output starts inside it.
    thinking_open: bool = False
    # The request switched thinking off (chat_template_kwargs): the output is all answer.
    thinking_off: bool = False


async def encode_prompt(request: inference_pb2.GenerateRequest, tokenizer: TokenizerClient) -> Prompt:
    which = request.WhichOneof("input")
    thinking_open = thinking_off = False
    if which == "input_ids":
        if not request.input_ids.ids:
            raise InvalidArgument("input_ids must not be empty")
        ids = list(request.input_ids.ids)
    else:
        if which == "text":
            if not request.text:
                raise InvalidArgument("the prompt text must not be empty")
            add_special = request.add_special_tokens if request.HasField("add_special_tokens") else True
            encode = tokenizer_pb2.EncodeRequest(text=request.text, add_special_tokens=add_special)
        elif which == "chat":
            encode = tokenizer_pb2.EncodeRequest(chat=request.chat)
            if request.HasField("add_special_tokens"):
                encode.add_special_tokens = request.add_special_tokens
        else:
            raise InvalidArgument("a generate request needs `text`, `input_ids` or `chat`")
        reply = await tokenizer.encode(encode)
        ids, thinking_open, thinking_off = list(reply.input_ids), reply.thinking_open, reply.thinking_off
        if not ids:
            raise InvalidArgument("the prompt encodes to no tokens")
    params = request.sampling_params
    if params.HasField("truncate_prompt_tokens"):
        keep = params.truncate_prompt_tokens
        if keep < 1:
            raise InvalidArgument(f"truncate_prompt_tokens must be at least 1, got {keep}")
        ids = ids[-keep:]
    return Prompt(ids, thinking_open, thinking_off)


async def encode_sampling_strings(
    params: common_pb2.SamplingParams, tokenizer: tokenizer_pb2_grpc.TokenizerStub
) -> common_pb2.SamplingParams:
    """A copy of params with bad_words and DRY breakers encoded into their *_ids fields (one RPC)."""
    breakers = list(params.dry_sequence_breakers)
    if not breakers and params.dry_multiplier > 0:
        breakers = list(DEFAULT_DRY_SEQUENCE_BREAKERS)
    if not params.bad_words and not breakers:
        return params
    if any(not word.strip() for word in params.bad_words):
        raise InvalidArgument("bad_words must not contain empty or blank strings")
    if any(not breaker for breaker in breakers):
        raise InvalidArgument("dry_sequence_breakers must not contain empty strings")
    # Each bad word as written and with a leading space: a word mid-sentence is usually a different token.
    variants = [(word.lstrip(), " " + word.lstrip()) for word in params.bad_words]
    texts = [text for pair in variants for text in pair] + breakers
    reply = await tokenizer.EncodeTexts(tokenizer_pb2.EncodeTextsRequest(texts=texts, add_special_tokens=False))
    encoded = [list(ids.ids) for ids in reply.ids]
    out = common_pb2.SamplingParams()
    out.CopyFrom(params)
    for i in range(len(variants)):
        plain, spaced = encoded[2 * i], encoded[2 * i + 1]
        out.bad_words_ids.add(ids=plain)
        # The spaced form is its own bad word only when it is a different token sequence of the same length
        # (otherwise it is the plain word preceded by a separate space token, already covered).
        if spaced and len(spaced) == len(plain) and spaced != plain:
            out.bad_words_ids.add(ids=spaced)
    for ids in encoded[2 * len(variants) :]:
        out.dry_sequence_breaker_ids.extend(ids)
    return out
