"""The Tokenizer servicer over real gRPC on loopback: stop regexes, EncodeTexts, TokenTexts."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio
from transformers import AutoTokenizer

from services.tokenizer.service import TokenizerServicer
from services.tokenizer.text_tokenizer import TextTokenizer
from turnout.errors import StatusInterceptor
from turnout.grpc_server import client_channel
from turnout.v1 import tokenizer_pb2, tokenizer_pb2_grpc


@pytest.fixture(scope="module")
def text_tokenizer(default_model_dir: Path) -> TextTokenizer:
    return TextTokenizer(default_model_dir)


async def _serve(tokenizer: TextTokenizer) -> AsyncIterator[tokenizer_pb2_grpc.TokenizerStub]:
    server = aio.server(interceptors=[StatusInterceptor()])
    servicer = TokenizerServicer(tokenizer)
    tokenizer_pb2_grpc.add_TokenizerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with client_channel(f"127.0.0.1:{port}") as channel:
        yield tokenizer_pb2_grpc.TokenizerStub(channel)
    await server.stop(0)
    await servicer.close()


@pytest.fixture
async def stub(text_tokenizer: TextTokenizer) -> AsyncIterator[tokenizer_pb2_grpc.TokenizerStub]:
    async for s in _serve(text_tokenizer):
        yield s


def ids_of(tokenizer: TextTokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


async def detokenize(
    stub: tokenizer_pb2_grpc.TokenizerStub, start: tokenizer_pb2.DetokenizeStart, ids: list[int]
) -> list[tokenizer_pb2.DetokenizeResponse]:
    """One token per chunk, as the router sends them, stopping once a response says the sequence ended."""
    call = stub.Detokenize()
    await call.write(tokenizer_pb2.DetokenizeRequest(start=start))
    assert await call.read() == tokenizer_pb2.DetokenizeResponse()  # the start is accepted with an empty answer
    responses = []
    for index, token_id in enumerate(ids):
        last = index == len(ids) - 1
        tokens = tokenizer_pb2.DetokenizeTokens(token_ids=[token_id], last=last)
        await call.write(tokenizer_pb2.DetokenizeRequest(tokens=tokens))
        response = await call.read()
        assert response is not aio.EOF
        responses.append(response)
        if response.HasField("matched_stop") or response.HasField("matched_regex"):
            break
    await call.done_writing()
    assert await call.read() is aio.EOF
    return responses


@pytest.mark.parametrize(
    ("start", "text"),
    [(tokenizer_pb2.DetokenizeStart(), "The end"), (tokenizer_pb2.DetokenizeStart(stop=["end"]), "The end and more")],
)
async def test_the_stream_ends_ok_with_the_answer_that_ends_its_sequence(
    stub: tokenizer_pb2_grpc.TokenizerStub,
    text_tokenizer: TextTokenizer,
    start: tokenizer_pb2.DetokenizeStart,
    text: str,
) -> None:
    """After the last chunk's answer, or the one where a stop matched, the server ends the call without
    waiting for the caller to close its side."""
    ids = ids_of(text_tokenizer, text)
    call = stub.Detokenize()
    await call.write(tokenizer_pb2.DetokenizeRequest(start=start))
    await call.read()
    for index, token_id in enumerate(ids):
        tokens = tokenizer_pb2.DetokenizeTokens(token_ids=[token_id], last=index == len(ids) - 1)
        await call.write(tokenizer_pb2.DetokenizeRequest(tokens=tokens))
        response = await call.read()
        if response.HasField("matched_stop") or tokens.last:
            break
    assert await asyncio.wait_for(call.read(), 60) is aio.EOF  # without a close from this side
    assert await call.code() is grpc.StatusCode.OK


async def test_stop_regex_cuts_the_text_and_reports_the_pattern(
    stub: tokenizer_pb2_grpc.TokenizerStub, text_tokenizer: TextTokenizer
) -> None:
    ids = ids_of(text_tokenizer, "The answer is 42. Done and more")
    start = tokenizer_pb2.DetokenizeStart(stop=["Done"], stop_regex=[r"\d+\."])
    responses = await detokenize(stub, start, ids)
    assert "".join(r.text for r in responses) == "The answer is "
    assert responses[-1].matched_regex == r"\d+\."
    assert not responses[-1].HasField("matched_stop")
    assert len(responses) == 7  # stopped at the "." token: "The", " answer", " is", " ", "4", "2", "."

    kept = await detokenize(stub, tokenizer_pb2.DetokenizeStart(stop_regex=[r"\d+\."], no_stop_trim=True), ids)
    assert "".join(r.text for r in kept) == "The answer is 42."


async def test_stop_regex_anchored_at_the_end_matches_the_last_chunk(
    stub: tokenizer_pb2_grpc.TokenizerStub, text_tokenizer: TextTokenizer
) -> None:
    ids = ids_of(text_tokenizer, "the end")
    responses = await detokenize(stub, tokenizer_pb2.DetokenizeStart(stop_regex=["end$"]), ids)
    assert [r.text for r in responses] == ["th", "e "]  # "e" might have begun "end": held one chunk
    assert responses[-1].matched_regex == "end$"


@pytest.mark.parametrize(
    ("pattern", "message"),
    [("(unclosed", "stop_regex '(unclosed' is not a valid regular expression"), ("a*", "matches the empty string")],
)
async def test_bad_stop_regex_fails_the_stream_with_invalid_argument(
    stub: tokenizer_pb2_grpc.TokenizerStub, pattern: str, message: str
) -> None:
    call = stub.Detokenize()
    await call.write(tokenizer_pb2.DetokenizeRequest(start=tokenizer_pb2.DetokenizeStart(stop_regex=[pattern])))
    with pytest.raises(aio.AioRpcError) as info:
        await asyncio.wait_for(call.read(), timeout=10)  # refused at once, before any tokens
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (info.value.details() or "")


async def test_encode_texts_encodes_each_text_in_order(
    stub: tokenizer_pb2_grpc.TokenizerStub, text_tokenizer: TextTokenizer
) -> None:
    texts = ["Hello world", "", " bad word", "é🎉"]
    response = await stub.EncodeTexts(tokenizer_pb2.EncodeTextsRequest(texts=texts))
    assert [list(entry.ids) for entry in response.ids] == [ids_of(text_tokenizer, t) for t in texts]
    assert list(response.ids[1].ids) == []
    assert (await stub.EncodeTexts(tokenizer_pb2.EncodeTextsRequest())).ids == []


async def test_encode_texts_adds_special_tokens_only_when_asked(default_model_dir: Path, tmp_path: Path) -> None:
    # A copy of the default tokenizer that puts <|im_start|> (id 1) before every text.
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(default_model_dir / name, tmp_path / name)
    spec = json.loads((default_model_dir / "tokenizer.json").read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    async for stub in _serve(TextTokenizer(tmp_path)):
        plain = await stub.EncodeTexts(tokenizer_pb2.EncodeTextsRequest(texts=["hi"]))
        special = await stub.EncodeTexts(tokenizer_pb2.EncodeTextsRequest(texts=["hi"], add_special_tokens=True))
        assert (list(plain.ids[0].ids), list(special.ids[0].ids)) == ([6004], [1, 6004])


async def test_token_texts_give_each_tokens_text_and_true_bytes(
    stub: tokenizer_pb2_grpc.TokenizerStub, text_tokenizer: TextTokenizer
) -> None:
    ids = [1, *ids_of(text_tokenizer, "Hi ÿé 🎉!")]
    response = await stub.TokenTexts(tokenizer_pb2.TokenTextsRequest(token_ids=ids))
    backend = text_tokenizer.backend
    assert list(response.texts) == [backend.decode([i], skip_special_tokens=False) for i in ids]
    assert response.texts[0] == "<|im_start|>"
    assert "\ufffd" in "".join(response.texts)  # the emoji is split across tokens
    assert b"".join(response.token_bytes) == "<|im_start|>Hi ÿé 🎉!".encode()


async def test_token_texts_of_the_whole_vocabulary_are_its_table_in_order(
    stub: tokenizer_pb2_grpc.TokenizerStub, text_tokenizer: TextTokenizer
) -> None:
    whole = await stub.TokenTexts(tokenizer_pb2.TokenTextsRequest(whole_vocabulary=True))
    assert len(whole.texts) == len(whole.token_bytes) == text_tokenizer.vocab_size
    ids = [1, *ids_of(text_tokenizer, "Hi ÿé 🎉!"), text_tokenizer.vocab_size - 1]
    some = await stub.TokenTexts(tokenizer_pb2.TokenTextsRequest(token_ids=ids))
    assert [whole.texts[i] for i in ids] == list(some.texts)
    assert [whole.token_bytes[i] for i in ids] == list(some.token_bytes)
    with pytest.raises(aio.AioRpcError) as both:
        await stub.TokenTexts(tokenizer_pb2.TokenTextsRequest(token_ids=[5], whole_vocabulary=True))
    assert both.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not both" in (both.value.details() or "")


async def test_token_texts_refuse_ids_outside_the_vocabulary(stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
    with pytest.raises(aio.AioRpcError) as info:
        await stub.TokenTexts(tokenizer_pb2.TokenTextsRequest(token_ids=[5, 123456]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "token id 123456 is out of range for a vocabulary of 49152"


async def test_get_info_is_the_tokenizer_config_as_loaded(
    stub: tokenizer_pb2_grpc.TokenizerStub, default_model_dir: Path
) -> None:
    info = await stub.GetInfo(tokenizer_pb2.GetTokenizerInfoRequest())
    hf = AutoTokenizer.from_pretrained(default_model_dir)
    assert info.tokenizer_class == type(hf).__name__
    config = json.loads(info.config_json)
    saved = json.loads((default_model_dir / "tokenizer_config.json").read_text())
    for key in ("bos_token", "eos_token", "model_max_length"):
        if key in saved and isinstance(saved[key], (str, int)):
            assert config[key] == saved[key]
    assert config["chat_template"] == hf.chat_template


async def test_get_info_shows_the_configured_chat_template(default_model_dir: Path, tmp_path: Path) -> None:
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    async for stub in _serve(TextTokenizer(default_model_dir, str(template))):
        info = await stub.GetInfo(tokenizer_pb2.GetTokenizerInfoRequest())
        assert json.loads(info.config_json)["chat_template"] == template.read_text()


async def detokenize_steps(
    stub: tokenizer_pb2_grpc.TokenizerStub, start: tokenizer_pb2.DetokenizeStart, steps: list[list[int]]
) -> list[tokenizer_pb2.DetokenizeResponse]:
    """All the steps in one message (step_sizes), the last of them the sequence's end: the answer's steps."""
    call = stub.Detokenize()
    await call.write(tokenizer_pb2.DetokenizeRequest(start=start))
    await call.read()
    ids = [t for step in steps for t in step]
    tokens = tokenizer_pb2.DetokenizeTokens(token_ids=ids, step_sizes=[len(s) for s in steps], last=True)
    await call.write(tokenizer_pb2.DetokenizeRequest(tokens=tokens))
    response = await call.read()
    assert response is not aio.EOF and not response.text
    call.cancel()
    return list(response.steps)


@pytest.mark.parametrize(
    "start",
    [
        tokenizer_pb2.DetokenizeStart(),
        tokenizer_pb2.DetokenizeStart(stop=["Done"]),
        tokenizer_pb2.DetokenizeStart(stop_regex=[r"\d+\."], no_stop_trim=True),
    ],
)
async def test_steps_in_one_message_are_answered_as_one_message_each(
    stub: tokenizer_pb2_grpc.TokenizerStub, text_tokenizer: TextTokenizer, start: tokenizer_pb2.DetokenizeStart
) -> None:
    """A stop that matches mid-message ends the answer at its step, as it ends the one-per-step stream."""
    ids = ids_of(text_tokenizer, "Caf\u00e9 list: 12. Done with it \u2014 more after")
    one_each = await detokenize(stub, start, ids)
    assert await detokenize_steps(stub, start, [[t] for t in ids]) == one_each
    if start.stop or start.stop_regex:
        assert len(one_each) < len(ids)


async def test_step_sizes_that_do_not_add_up_are_invalid(stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
    call = stub.Detokenize()
    await call.write(tokenizer_pb2.DetokenizeRequest(start=tokenizer_pb2.DetokenizeStart()))
    await call.read()
    tokens = tokenizer_pb2.DetokenizeTokens(token_ids=[10, 11, 12], step_sizes=[1, 1])
    await call.write(tokenizer_pb2.DetokenizeRequest(tokens=tokens))
    with pytest.raises(aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "step_sizes" in (info.value.details() or "")
