"""The engine core: requests in, one step at a time, outputs out.

    step = schedule -> build batch -> run model -> sample -> postprocess -> emit

Synchronous and single-threaded: `EngineLoop` runs it on its own thread for the
gRPC service, `LLM` calls it directly for offline use. Nothing here knows gRPC.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import cast

from services.engine.block_manager import BlockManager
from services.engine.config import EngineConfig
from services.engine.kv_cache_sizing import num_kv_blocks
from services.engine.model_loader import LoadedModel, load_model
from services.engine.model_runner import ModelRunner
from services.engine.request import EngineOutput, EngineRequest, Finish, LoadReport
from services.engine.sampler import sample
from services.engine.scheduler import Policy, Scheduler
from services.engine.sequence import Sequence
from turnout.errors import InvalidArgument

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepOutput:
    request_id: str
    output: EngineOutput


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config
        self.loaded = loaded or load_model(config)
        blocks = num_kv_blocks(config, self.loaded)
        self.block_manager = BlockManager(blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_running_requests=config.max_running_requests,
            policy=cast(Policy, config.scheduling_policy),  # validated by EngineConfig
        )
        backend = self.loaded.make_backend(blocks, config.block_size)
        self.runner = ModelRunner(self.loaded.model, backend, config.block_size, self.loaded.device)
        self._sequences: dict[str, Sequence] = {}
        log.info(
            "kv cache ready",
            extra={"blocks": blocks, "block_size": config.block_size, "tokens": blocks * config.block_size},
        )

    # -- requests -------------------------------------------------------------

    def check_fits(self, request: EngineRequest) -> None:
        """Refuse up front a request that could never run, whatever else is running."""
        total = len(request.input_ids) + request.sampling.max_new_tokens
        capacity = self.block_manager.num_total_blocks * self.config.block_size
        if self.block_manager.blocks_needed(total) > self.block_manager.num_total_blocks:
            raise InvalidArgument(
                f"the request needs room for {total} tokens (prompt {len(request.input_ids)} + "
                f"max_new_tokens {request.sampling.max_new_tokens}) but the KV cache holds {capacity} tokens"
            )

    def add_request(self, request: EngineRequest, priority: int = 0) -> None:
        if request.request_id in self._sequences:
            raise InvalidArgument(f"request id {request.request_id!r} is already in use")
        self.check_fits(request)
        seq = Sequence(request, priority=priority)
        self._sequences[request.request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str, message: str = "aborted") -> bool:
        """Mark a request aborted; the next step frees its blocks and emits its end."""
        seq = self._sequences.get(request_id)
        if seq is None:
            return False
        seq.abort_message = message
        return True

    def has_work(self) -> bool:
        return bool(self._sequences)

    def load(self) -> LoadReport:
        used = round(self.block_manager.usage * self.block_manager.num_total_blocks) * self.config.block_size
        return LoadReport(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_tokens_used=used,
            kv_tokens_capacity=self.block_manager.num_total_blocks * self.config.block_size,
        )

    # -- the step -------------------------------------------------------------

    def step(self) -> list[StepOutput]:
        outputs = self._reap_aborted()
        scheduled = self.scheduler.schedule()
        if not scheduled.scheduled:
            return outputs
        batch = self.runner.build_batch(scheduled.scheduled, self.block_manager)
        logits = self.runner.run(batch)
        tokens = sample(logits, batch.sample_seqs, self.loaded.eos_token_ids)
        self.scheduler.commit(scheduled)
        outputs += self._postprocess(batch.sample_seqs, tokens)
        return outputs

    def _reap_aborted(self) -> list[StepOutput]:
        outputs = []
        for seq in [s for s in self._sequences.values() if s.abort_message is not None]:
            outputs.append(self._finish(seq, Finish("abort", message=seq.abort_message or "aborted")))
        return outputs

    def _postprocess(self, seqs: list[Sequence], tokens: list[int]) -> list[StepOutput]:
        outputs = []
        for seq, token in zip(seqs, tokens, strict=True):
            seq.token_ids.append(token)
            finish = self._stop_condition(seq, token)
            if finish is not None:
                outputs.append(self._finish(seq, finish))
            else:
                outputs.append(self._emit(seq, None))
        return outputs

    def _stop_condition(self, seq: Sequence, token: int) -> Finish | None:
        settings = seq.request.sampling
        is_stop = token in settings.stop_token_ids or (not settings.ignore_eos and token in self.loaded.eos_token_ids)
        if is_stop and seq.num_output_tokens >= settings.min_new_tokens:
            return Finish("stop", matched_token_id=token)
        if seq.num_output_tokens >= settings.max_new_tokens:
            return Finish("length")
        return None

    def _finish(self, seq: Sequence, finish: Finish) -> StepOutput:
        self.scheduler.remove(seq)
        del self._sequences[seq.seq_id]
        seq.finish = finish
        return self._emit(seq, finish)

    def _emit(self, seq: Sequence, finish: Finish | None) -> StepOutput:
        new = seq.output_ids[seq.num_emitted :]
        seq.num_emitted = seq.num_output_tokens
        output = EngineOutput(
            token_ids=new,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_output_tokens,
            cached_tokens=seq.num_cached_tokens,
            finish=finish,
        )
        return StepOutput(seq.seq_id, output)
