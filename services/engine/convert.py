"""Protobuf <-> engine dataclasses: the only module of the engine that knows the wire format."""

from __future__ import annotations

from services.engine.model_loader import LoadedModel
from services.engine.request import EngineOutput, EngineRequest, Finish, LoadReport
from services.engine.sampling import resolve
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2, engine_pb2


def request_from_proto(message: engine_pb2.EngineGenerateRequest, loaded: LoadedModel) -> EngineRequest:
    if not message.request_id:
        raise InvalidArgument("request_id must not be empty")
    if not message.input_ids:
        raise InvalidArgument("input_ids must not be empty")
    vocab = loaded.vocab_size
    bad = [t for t in message.input_ids if t >= vocab]
    if bad:
        raise InvalidArgument(f"token id {bad[0]} is out of range for a vocabulary of {vocab}")
    options = message.logprob_options
    if options.return_logprob or options.top_logprobs_num or options.token_ids_logprob:
        raise InvalidArgument("logprobs are not supported by this engine yet")
    if any(t >= vocab for t in message.sampling_params.stop_token_ids):
        raise InvalidArgument(f"stop_token_ids must be below the vocabulary size {vocab}")
    sampling = resolve(
        message.sampling_params,
        loaded.info.generation_defaults,
        prompt_len=len(message.input_ids),
        max_model_len=loaded.max_model_len,
    )
    return EngineRequest(request_id=message.request_id, input_ids=tuple(message.input_ids), sampling=sampling)


def finish_to_proto(finish: Finish, completion_tokens: int) -> common_pb2.FinishReason:
    if finish.kind == "stop":
        return common_pb2.FinishReason(stop=common_pb2.FinishReason.Stop(token_id=finish.matched_token_id))
    if finish.kind == "length":
        return common_pb2.FinishReason(length=common_pb2.FinishReason.Length(length=completion_tokens))
    return common_pb2.FinishReason(abort=common_pb2.FinishReason.Abort(message=finish.message))


def output_to_proto(output: EngineOutput) -> engine_pb2.EngineGenerateResponse:
    if output.finish is None:
        return engine_pb2.EngineGenerateResponse(
            chunk=engine_pb2.EngineChunk(
                token_ids=output.token_ids,
                prompt_tokens=output.prompt_tokens,
                completion_tokens=output.completion_tokens,
                cached_tokens=output.cached_tokens,
            )
        )
    return engine_pb2.EngineGenerateResponse(
        complete=engine_pb2.EngineComplete(
            token_ids=output.token_ids,
            finish_reason=finish_to_proto(output.finish, output.completion_tokens),
            usage=common_pb2.Usage(
                prompt_tokens=output.prompt_tokens,
                completion_tokens=output.completion_tokens,
                cached_tokens=output.cached_tokens,
            ),
        )
    )


def load_to_proto(report: LoadReport) -> engine_pb2.Load:
    capacity = max(report.kv_tokens_capacity, 1)
    return engine_pb2.Load(
        running_requests=report.running,
        waiting_requests=report.waiting,
        kv_cache_usage=report.kv_tokens_used / capacity,
        kv_cache_capacity_tokens=report.kv_tokens_capacity,
    )
