"""convert.output_to_proto fills the response in place and leaves empty lists out (issue 15: the engine
builds one per sample per step); the message must be exactly the one built field by field from keyword
arguments, every field of a chunk and of a complete, with and without the optional lists."""

from __future__ import annotations

import pytest

from services.engine.convert import output_to_proto, outputs_to_proto
from services.engine.logprobs import PositionLogprobs, TokenLogprob
from services.engine.request import EngineOutput, Finish
from turnout.v1 import common_pb2, engine_pb2

POSITION = PositionLogprobs(TokenLogprob(7, -0.25, 1), top=(TokenLogprob(7, -0.25, 1), TokenLogprob(9, -1.5, 2)))
PROMPT_POSITION = PositionLogprobs(TokenLogprob(3, -2.0, 4), requested=(TokenLogprob(11, -3.0, 8),))


def _token(t: TokenLogprob) -> common_pb2.TokenLogprob:
    return common_pb2.TokenLogprob(token_id=t.token_id, logprob=t.logprob, rank=t.rank)


def _positions(positions: list[PositionLogprobs]) -> list[common_pb2.PositionLogprobs]:
    return [
        common_pb2.PositionLogprobs(
            token=_token(p.token), top=[_token(t) for t in p.top], requested=[_token(t) for t in p.requested]
        )
        for p in positions
    ]


def reference(output: EngineOutput, finish: common_pb2.FinishReason | None) -> engine_pb2.EngineGenerateResponse:
    """Every field given as a keyword argument, lists included when empty."""
    hidden = [common_pb2.HiddenState(values=row) for row in output.hidden_states]
    if finish is None:
        return engine_pb2.EngineGenerateResponse(
            chunk=engine_pb2.EngineChunk(
                index=output.index,
                token_ids=output.token_ids,
                logprobs=_positions(output.logprobs),
                prompt_tokens=output.prompt_tokens,
                completion_tokens=output.completion_tokens,
                cached_tokens=output.cached_tokens,
                input_logprobs=_positions(output.input_logprobs),
                hidden_states=hidden,
            )
        )
    return engine_pb2.EngineGenerateResponse(
        complete=engine_pb2.EngineComplete(
            index=output.index,
            token_ids=output.token_ids,
            logprobs=_positions(output.logprobs),
            finish_reason=finish,
            usage=common_pb2.Usage(
                prompt_tokens=output.prompt_tokens,
                completion_tokens=output.completion_tokens,
                cached_tokens=output.cached_tokens,
            ),
            input_logprobs=_positions(output.input_logprobs),
            cumulative_logprob=output.cumulative_logprob,
            embedding=output.embedding or [],
            hidden_states=hidden,
        )
    )


STOP = common_pb2.FinishReason(stop=common_pb2.FinishReason.Stop(token_id=5))
CASES: list[tuple[str, EngineOutput, common_pb2.FinishReason | None]] = [
    ("one token", EngineOutput([5], prompt_tokens=64, completion_tokens=3), None),
    ("every field at its default", EngineOutput([], prompt_tokens=0, completion_tokens=0), None),
    (
        "chunk with every list",
        EngineOutput(
            [7, 8],
            prompt_tokens=9,
            completion_tokens=2,
            cached_tokens=4,
            index=2,
            logprobs=[POSITION, POSITION],
            input_logprobs=[PROMPT_POSITION],
            hidden_states=[[0.5, -1.0], [2.0, 0.0]],
        ),
        None,
    ),
    ("stop", EngineOutput([5], 4, 6, cached_tokens=2, finish=Finish("stop", matched_token_id=5)), STOP),
    (
        "eos",
        EngineOutput([2], 4, 1, finish=Finish("stop", matched_token_id=2, eos=True), cumulative_logprob=-3.5),
        common_pb2.FinishReason(stop=common_pb2.FinishReason.Stop(eos_token_id=2)),
    ),
    (
        "length with lists",
        EngineOutput(
            [],
            4,
            8,
            finish=Finish("length"),
            index=1,
            logprobs=[POSITION],
            input_logprobs=[PROMPT_POSITION],
            hidden_states=[[1.0]],
            request_finished=True,
        ),
        common_pb2.FinishReason(length=common_pb2.FinishReason.Length(length=8)),
    ),
    (
        "pooled",
        EngineOutput([], 12, 0, finish=Finish("length"), embedding=[0.25, -0.5, 1.0], request_finished=True),
        common_pb2.FinishReason(length=common_pb2.FinishReason.Length(length=0)),
    ),
    (
        "abort",
        EngineOutput([], 0, 0, finish=Finish("abort", message="client left")),
        common_pb2.FinishReason(abort=common_pb2.FinishReason.Abort(message="client left")),
    ),
]


@pytest.mark.parametrize(("output", "finish"), [(o, f) for _, o, f in CASES], ids=[name for name, *_ in CASES])
def test_output_message_is_the_field_by_field_one(output: EngineOutput, finish: common_pb2.FinishReason | None) -> None:
    got, want = output_to_proto(output), reference(output, finish)
    assert got == want
    assert got.WhichOneof("kind") == want.WhichOneof("kind")
    assert got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)


def test_a_batch_message_holds_the_same_messages() -> None:
    outputs = [o for _, o, _ in CASES]
    message = outputs_to_proto(outputs)
    rest = list(message.batch)
    message.ClearField("batch")
    assert [message, *rest] == [reference(o, f) for _, o, f in CASES]
