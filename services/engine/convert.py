"""Protobuf <-> engine dataclasses: the only module of the engine that knows the wire format."""

from __future__ import annotations

from services.engine.config import EngineConfig
from services.engine.logprobs import PositionLogprobs, TokenLogprob
from services.engine.model_loader import LoadedModel
from services.engine.pooling import PoolingSettings, PoolingType
from services.engine.processors.catalog import ProcessorCatalog
from services.engine.request import EngineOutput, EngineRequest, Finish, LoadReport
from services.engine.sampling_validation import Limits, resolve
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2, engine_pb2


def request_from_proto(
    message: engine_pb2.EngineGenerateRequest,
    loaded: LoadedModel,
    config: EngineConfig,
    processors: ProcessorCatalog | None = None,
) -> EngineRequest:
    if not message.request_id:
        raise InvalidArgument("request_id must not be empty")
    if not message.input_ids:
        raise InvalidArgument("input_ids must not be empty")
    if message.priority and config.scheduling_policy != "priority":
        # As vLLM: a priority the scheduler would ignore is refused, not silently dropped.
        raise InvalidArgument(
            f"priority {message.priority} needs --scheduling-policy priority (this engine schedules "
            f"{config.scheduling_policy})"
        )
    vocab = loaded.vocab_size
    if max(message.input_ids) >= vocab:  # in C; the Python scan below only names the first bad id
        bad = next(t for t in message.input_ids if t >= vocab)
        raise InvalidArgument(f"token id {bad} is out of range for a vocabulary of {vocab}")
    # The model's (or --generation-config's) values, none under `openai`, with the overrides (model_loader).
    defaults = loaded.info.generation_defaults
    limits = Limits.of_engine(
        config,
        prompt_len=len(message.input_ids),
        max_model_len=loaded.max_model_len,
        vocab_size=vocab,
        processors=processors,
    )
    params = message.sampling_params
    pooling = None
    if message.HasField("pooling"):
        pooling = pooling_from_proto(message.pooling, loaded.info.hidden_size)
        if params.HasField("max_new_tokens") and params.max_new_tokens != 0:
            raise InvalidArgument(
                f"a pooling request generates nothing: max_new_tokens must be 0, got {params.max_new_tokens}"
            )
        params = common_pb2.SamplingParams()
        params.CopyFrom(message.sampling_params)
        params.max_new_tokens = 0
    sampling = resolve(params, defaults, limits, message.logprob_options)
    if message.return_hidden_states and sampling.best_of > 1:
        raise InvalidArgument(f"return_hidden_states takes n and best_of 1, got {sampling.best_of}")
    return EngineRequest(
        request_id=message.request_id,
        input_ids=tuple(message.input_ids),
        sampling=sampling,
        lora_name=message.lora_name or None,
        pooling=pooling,
        return_hidden_states=message.return_hidden_states,
    )


_POOLING_TYPES: dict[int, PoolingType] = {
    common_pb2.PoolingParams.TYPE_UNSPECIFIED: "last",
    common_pb2.PoolingParams.LAST: "last",
    common_pb2.PoolingParams.MEAN: "mean",
    common_pb2.PoolingParams.FIRST: "first",
}


def pooling_from_proto(message: common_pb2.PoolingParams, hidden_size: int) -> PoolingSettings:
    kind = _POOLING_TYPES.get(message.type)
    if kind is None:
        raise InvalidArgument(f"pooling type {message.type} is not one of LAST, MEAN, FIRST")
    dimensions = message.dimensions if message.HasField("dimensions") else None
    if dimensions is not None and not 1 <= dimensions <= hidden_size:
        raise InvalidArgument(
            f"dimensions must be between 1 and the model's hidden size {hidden_size}, got {dimensions}"
        )
    normalize = message.normalize if message.HasField("normalize") else True
    return PoolingSettings(kind, normalize, dimensions)


def finish_to_proto(finish: Finish, completion_tokens: int) -> common_pb2.FinishReason:
    if finish.kind == "stop":
        token = finish.matched_token_id
        if token is None:  # the grammar terminated: nothing matched
            return common_pb2.FinishReason(stop=common_pb2.FinishReason.Stop())
        stop = (
            common_pb2.FinishReason.Stop(eos_token_id=token)
            if finish.eos
            else common_pb2.FinishReason.Stop(token_id=token)
        )
        return common_pb2.FinishReason(stop=stop)
    if finish.kind == "length":
        return common_pb2.FinishReason(length=common_pb2.FinishReason.Length(length=completion_tokens))
    return common_pb2.FinishReason(abort=common_pb2.FinishReason.Abort(message=finish.message))


def _token(token: TokenLogprob) -> common_pb2.TokenLogprob:
    return common_pb2.TokenLogprob(token_id=token.token_id, logprob=token.logprob, rank=token.rank)


def logprobs_to_proto(positions: list[PositionLogprobs]) -> list[common_pb2.PositionLogprobs]:
    return [
        common_pb2.PositionLogprobs(
            token=_token(p.token), top=[_token(t) for t in p.top], requested=[_token(t) for t in p.requested]
        )
        for p in positions
    ]


def hidden_states_to_proto(rows: list[list[float]]) -> list[common_pb2.HiddenState]:
    return [common_pb2.HiddenState(values=row) for row in rows]


def output_to_proto(output: EngineOutput) -> engine_pb2.EngineGenerateResponse:
    response = engine_pb2.EngineGenerateResponse()
    output_into(response, output)
    return response


def output_into(response: engine_pb2.EngineGenerateResponse, output: EngineOutput) -> None:
    """`output` written into `response` (empty), in place, the lists only when not empty: most outputs are
    one token and nothing else, and building a sub-message and its empty lists to copy them in cost twice
    as much as the rest."""
    if output.finish is None:
        chunk = response.chunk
        chunk.index = output.index
        chunk.token_ids.extend(output.token_ids)
        chunk.prompt_tokens = output.prompt_tokens
        chunk.completion_tokens = output.completion_tokens
        chunk.cached_tokens = output.cached_tokens
        _add_lists(chunk, output)
        return
    complete = response.complete
    complete.index = output.index
    complete.token_ids.extend(output.token_ids)
    complete.finish_reason.CopyFrom(finish_to_proto(output.finish, output.completion_tokens))
    usage = complete.usage
    usage.prompt_tokens = output.prompt_tokens
    usage.completion_tokens = output.completion_tokens
    usage.cached_tokens = output.cached_tokens
    complete.cumulative_logprob = output.cumulative_logprob
    if output.embedding:
        complete.embedding.extend(output.embedding)
    _add_lists(complete, output)


def _add_lists(message: engine_pb2.EngineChunk | engine_pb2.EngineComplete, output: EngineOutput) -> None:
    if output.logprobs:
        message.logprobs.extend(logprobs_to_proto(output.logprobs))
    if output.input_logprobs:
        message.input_logprobs.extend(logprobs_to_proto(output.input_logprobs))
    if output.hidden_states:
        message.hidden_states.extend(hidden_states_to_proto(output.hidden_states))


def outputs_to_proto(outputs: list[EngineOutput]) -> engine_pb2.EngineGenerateResponse:
    response = engine_pb2.EngineGenerateResponse()
    outputs_into(response, outputs)
    return response


def outputs_into(response: engine_pb2.EngineGenerateResponse, outputs: list[EngineOutput]) -> None:
    """One message for a batch of outputs, written into `response` (empty): the first, followed by the rest
    in `batch` (engine.proto), each built where it goes."""
    output_into(response, outputs[0])
    for output in outputs[1:]:
        output_into(response.batch.add(), output)


def load_to_proto(report: LoadReport) -> engine_pb2.Load:
    capacity = max(report.kv_tokens_capacity, 1)
    return engine_pb2.Load(
        running_requests=report.running,
        waiting_requests=report.waiting,
        kv_cache_usage=report.kv_tokens_used / capacity,
        kv_cache_capacity_tokens=report.kv_tokens_capacity,
    )
