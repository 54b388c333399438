"""Offline generation in-process, on the same engine core as the service:

    from turnout import LLM
    llm = LLM(model="/path/to/hf-folder")
    outputs = llm.generate(["The capital of France is"], {"temperature": 0, "max_new_tokens": 16})
    print(outputs[0].text)

Sampling parameters are a dict with the SGLang/Turnout names (the fields of
`turnout.v1.SamplingParams`), one for all prompts or one per prompt; constraints
too: `{"json_schema": "...", "max_new_tokens": 64}`, `{"choice": {"values": ["yes", "no"]}}`.
With `enable_lora=True, lora_modules=(("sql", path),)`, `lora_path` (SGLang's name) picks an
adapter for all prompts or one per prompt (None: the base model); see docs/lora.md.
`llm.embed(prompts, {"type": "mean", "dimensions": 64})` pools each prompt's final hidden states
instead (the fields of `turnout.v1.PoolingParams`; see services/engine/pooling.py).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, cast

from google.protobuf.json_format import ParseDict, ParseError

from services.engine.config import EngineConfig
from services.engine.convert import pooling_from_proto
from services.engine.llm_engine import LLMEngine
from services.engine.request import EngineRequest, Finish
from services.engine.sampling_validation import resolve
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2


@dataclass(frozen=True)
class SampleOutput:
    output_token_ids: list[int]
    text: str
    finish: Finish
    cumulative_logprob: float


@dataclass(frozen=True)
class RequestOutput:
    """One prompt's result: its first sample's fields, and every sample (n > 1) in `samples`."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]
    text: str
    finish: Finish
    cached_tokens: int
    samples: list[SampleOutput]


class LLM:
    def __init__(self, model: str | Path, **engine_options: Any) -> None:
        from transformers import AutoTokenizer

        known = {f.name for f in fields(EngineConfig)}
        unknown = set(engine_options) - known
        if unknown:
            raise TypeError(f"unknown engine options: {', '.join(sorted(unknown))}")
        self.engine = LLMEngine(EngineConfig(model=Path(model), **engine_options))
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop the engine's other tensor-parallel ranks, if it has any (`tensor_parallel_size` > 1)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        sampling_params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        lora_path: str | Sequence[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids) and return outputs in prompt order."""
        batch = [prompts] if isinstance(prompts, str) else list(prompts)
        if not batch:
            return []
        per_prompt = (
            [sampling_params or {}] * len(batch)
            if sampling_params is None or isinstance(sampling_params, Mapping)
            else list(sampling_params)
        )
        if len(per_prompt) != len(batch):
            raise InvalidArgument(f"{len(per_prompt)} sampling_params for {len(batch)} prompts")
        adapters = [lora_path] * len(batch) if lora_path is None or isinstance(lora_path, str) else list(lora_path)
        if len(adapters) != len(batch):
            raise InvalidArgument(f"{len(adapters)} lora_path entries for {len(batch)} prompts")
        # Validate every request before adding any, so a bad one leaves nothing behind in the engine.
        requests = [
            dataclasses.replace(self._request(cast("str | Sequence[int]", prompt), params), lora_name=adapter)
            for prompt, params, adapter in zip(batch, per_prompt, adapters, strict=True)
        ]
        for request in requests:
            self.engine.check_fits(request)
            if request.lora_name is not None:
                self.engine.resolve_lora(request.lora_name)
        for request in requests:
            self.engine.add_request(request)
        return self._run(
            {r.request_id: list(r.input_ids) for r in requests}, {r.request_id: r.sampling.n for r in requests}
        )

    def embed(
        self, prompts: str | Sequence[str] | Sequence[Sequence[int]], pooling: Mapping[str, Any] | None = None
    ) -> list[list[float]]:
        """Pool every prompt (text or token ids) into one vector, in prompt order."""
        batch = [prompts] if isinstance(prompts, str) else list(prompts)
        try:
            proto = ParseDict(dict(pooling or {}), common_pb2.PoolingParams())
        except ParseError as exc:
            raise InvalidArgument(f"pooling: {exc}") from None
        settings = pooling_from_proto(proto, self.engine.loaded.info.hidden_size)
        requests = [
            dataclasses.replace(self._request(cast("str | Sequence[int]", p), {"max_new_tokens": 0}), pooling=settings)
            for p in batch
        ]
        for request in requests:
            self.engine.add_request(request)
        pending = {r.request_id for r in requests}
        vectors: dict[str, list[float]] = {}
        while pending:
            for step in self.engine.step():
                if step.request_id in pending and step.output.request_finished:
                    pending.discard(step.request_id)
                    vectors[step.request_id] = step.output.embedding or []
        return [vectors[r.request_id] for r in requests]

    def _request(self, prompt: str | Sequence[int], params: Mapping[str, Any]) -> EngineRequest:
        ids = self.tokenizer.encode(prompt, add_special_tokens=True) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise InvalidArgument("a prompt must not be empty")
        try:
            proto = ParseDict(dict(params), common_pb2.SamplingParams())
        except ParseError as exc:
            raise InvalidArgument(f"sampling_params: {exc}") from None
        info = self.engine.loaded.info
        settings = resolve(proto, info.generation_defaults, self.engine.limits(len(ids)))
        # Compiled now, so a constraint that does not compile is refused before any request is added.
        grammar = self.engine.grammars.compile(settings.constraint) if settings.constraint is not None else None
        return EngineRequest(f"offline-{next(self._ids)}", tuple(ids), settings, grammar)

    def _run(self, prompt_ids: dict[str, list[int]], num_returned: dict[str, int]) -> list[RequestOutput]:
        """Step the engine until every request finished; outputs in the order of prompt_ids. Of best_of
        samples, the n with the highest cumulative log-probability are kept, best first."""
        pending = set(prompt_ids)
        tokens: dict[tuple[str, int], list[int]] = {}
        samples: dict[str, dict[int, SampleOutput]] = {rid: {} for rid in prompt_ids}
        cached: dict[str, int] = {}
        while pending:
            for step in self.engine.step():
                rid, out = step.request_id, step.output
                if rid not in pending:
                    continue
                ids = tokens.setdefault((rid, out.index), [])
                ids += out.token_ids
                cached[rid] = out.cached_tokens
                if out.finish is not None:
                    text = cast(str, self.tokenizer.decode(ids, skip_special_tokens=True))
                    samples[rid][out.index] = SampleOutput(ids, text, out.finish, out.cumulative_logprob)
                if out.request_finished:
                    pending.discard(rid)
        results = []
        for rid, prompt in prompt_ids.items():
            ordered = [samples[rid][i] for i in sorted(samples[rid])]
            if len(ordered) > num_returned[rid]:
                ordered = sorted(ordered, key=lambda s: -s.cumulative_logprob)[: num_returned[rid]]
            first = ordered[0]
            results.append(
                RequestOutput(prompt, first.output_token_ids, first.text, first.finish, cached[rid], ordered)
            )
        return results
