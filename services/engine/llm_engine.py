"""The engine core: requests in, one step at a time, outputs out.

    step N = schedule N -> build batch -> run model          (queued on the device)
             -> collect step N-1's tokens -> postprocess N-1 (stops, grammar, emit)
             -> reap aborted -> commit N -> launch sampling N (tokens stay on the device)
             [-> collect N -> postprocess N, without the overlap schedule]

With the overlap schedule (the default on CUDA) the CPU postprocesses step N-1
while the device runs step N's forward pass: a launched sampling leaves a
placeholder in each sequence (sequence.py) so the scheduler, which only counts
tokens, can schedule the next decode before the token is known, and the batch
takes it from the device. Collecting N-1 before committing and sampling N means
that everything reading token values (prefix-cache hashing, penalties, grammar,
processors, stops, emitted outputs) sees real tokens, and reaping aborted
requests after it means an aborted sequence emits its pending token, never the
placeholder. A sequence that stopped at N-1 while scheduled in N wastes that
one computed token: it is dropped from the commit and the sampling (one ending
by length or aborted is not scheduled at all: Sequence.is_ending). Without the
overlap each step collects its own sampling at once: the same code, in the
same order.

Synchronous and single-threaded: `EngineLoop` runs it on its own thread for the
gRPC service, `LLM` calls it directly for offline use. Nothing here knows gRPC.

With --tensor-parallel-size N this is rank 0 of N: it starts the other ranks
(parallel/ranks.py) and its runner sends each forward to them before running it
(parallel/driver.py); everything else here is the same on one rank or N. Call
`close()` to stop them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import torch

from services.engine import malloc_tuning
from services.engine.attention.backend import AttentionBackend
from services.engine.beam_search import BeamSearch
from services.engine.block_manager import BlockManager
from services.engine.config import EngineConfig
from services.engine.cuda_graphs import build_decode_graphs
from services.engine.grammar.compiler import GrammarCompiler
from services.engine.grammar.state import GrammarState
from services.engine.kv_cache_sizing import GIB, size_kv_pool
from services.engine.logprobs import LogprobQuery, prompt_logprobs
from services.engine.lora.adapter import LoraAdapter, LoraError
from services.engine.lora.manager import LoraManager
from services.engine.model_loader import LoadedModel, load_model
from services.engine.model_runner import Batch, ModelRunner, StepLogits
from services.engine.parallel.driver import DriverRunner
from services.engine.parallel.ranks import Ranks
from services.engine.parallel.step_channel import StepChannel
from services.engine.pooling import fold_pooling
from services.engine.processors.catalog import ProcessorCatalog
from services.engine.request import EngineOutput, EngineRequest, Finish, LoadReport
from services.engine.sampler.draw import fused_draw_for
from services.engine.sampling_validation import Limits
from services.engine.scheduler import Policy, ScheduledSequence, Scheduler
from services.engine.sequence import Sequence
from services.engine.sequence_group import SequenceGroup
from services.engine.skip_forward import SkipForwardRunner, launch_counting
from services.engine.step_sampler import PendingSample, SampledToken, launch_sampling
from services.engine.vocab import ModelVocab
from turnout.errors import InvalidArgument

log = logging.getLogger(__name__)


@dataclass(slots=True)  # one per sample per step: see EngineOutput on why not frozen
class StepOutput:
    request_id: str
    output: EngineOutput


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config
        # The other tensor-parallel ranks, started before this one loads its shard (they load theirs meanwhile).
        self.ranks = Ranks.start(config) if config.tensor_parallel_size > 1 else None
        try:
            self._build(config, loaded)
        except BaseException:
            if self.ranks is not None:
                self.ranks.abandon()
            raise

    def _build(self, config: EngineConfig, loaded: LoadedModel | None) -> None:
        tp = self.ranks.tp if self.ranks is not None else None
        self.loaded = loaded or load_model(config, tp)
        if self.loaded.device.type == "cpu":
            malloc_tuning.tune()  # a step's large temporaries reuse freed memory (malloc_tuning.py)
        # Whether sampling draws unseeded batches in the fused kernel (--sampling-backend).
        self.fused_draw = fused_draw_for(config.sampling_backend, self.loaded.device)
        # The LoRA adapters (--enable-lora): their slots' weights are attached to the model's projections,
        # before the KV pool is sized, so the memory they take is not handed to the pool too.
        self.loras = (
            LoraManager(
                self.loaded.model,
                max_loras=config.max_loras,
                max_rank=config.max_lora_rank,
                modules=config.lora_modules,
            )
            if config.enable_lora
            else None
        )
        pool = size_kv_pool(config, self.loaded, self._make_backend, tp=tp)
        if pool.max_model_len != self.loaded.max_model_len:
            self.loaded = self.loaded.with_max_model_len(pool.max_model_len)
        blocks = pool.blocks
        self.block_manager = BlockManager(blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_running_requests=config.max_running_requests,
            policy=cast(Policy, config.scheduling_policy),  # validated by EngineConfig
            lora=self.loras,
        )
        backend = self._make_backend(blocks)
        log.info(
            "kv cache ready",
            extra={
                "blocks": blocks,
                "block_size": config.block_size,
                "tokens": blocks * config.block_size,
                "gib": round(blocks * self.loaded.kv_bytes_per_block(config.block_size) / GIB, 3),
                "max_model_len": pool.max_model_len,
                # Sequences of max_model_len tokens the pool holds at once (vLLM's "maximum concurrency").
                "max_concurrency_at_full_length": round(blocks * config.block_size / pool.max_model_len, 2),
                "attention": type(backend).__name__,
            },
        )
        # Captured after the KV cache exists: the graphs record its addresses.
        graphs = None if config.skip_forward else build_decode_graphs(config, self.loaded, backend)
        if tp is None:
            runner_class = SkipForwardRunner if config.skip_forward else ModelRunner
            self.runner = runner_class(
                self.loaded.model, backend, config.block_size, self.loaded.device, graphs, lora=self.loras
            )
        else:
            self.channel = StepChannel(tp, self.loaded.dtype)
            self.runner = DriverRunner(self.loaded.model, backend, config.block_size, self.loaded.device)
            self.runner.channel = self.channel
        # On by default where the device runs asynchronously (CUDA); on CPU there is nothing to overlap.
        overlap = config.overlap_schedule
        self.overlap = overlap if overlap is not None else self.loaded.device.type == "cuda"
        # The last launched sampling while its tokens are on the device (overlap schedule only, between steps).
        self._pending: PendingSample | None = None
        log.info("overlap schedule " + ("on" if self.overlap else "off"), extra={"overlap_schedule": self.overlap})
        if config.seed is not None:
            # Unseeded rows draw from torch's default generators (sampler/draw.py), the fused CUDA kernel
            # included: seeded once here, a run repeats its draws (vLLM's --seed).
            torch.manual_seed(config.seed)
        self._groups: dict[str, SequenceGroup] = {}
        # Whether abort() marked anything since the last reaping: without it, no group or sample has an
        # abort_message to reap, and the step skips walking every group (O(requests) per step).
        self._aborts_pending = False
        # The model's tokenizer files, read only for grammars and think tags (loaded on first use).
        self.vocab = ModelVocab(config.model, self.loaded.vocab_size, self.loaded.eos_token_ids)
        self.grammars = GrammarCompiler(self.vocab, timeout_s=config.grammar_compile_timeout)
        self.processors = ProcessorCatalog(
            self.vocab,
            allow_serialized=config.enable_custom_logit_processor,
            think_start_token=config.think_start_token,
            think_end_token=config.think_end_token,
        )

    def close(self, *, step_running: bool = False) -> None:
        """Stop the other tensor-parallel ranks (no step may run after); nothing on one rank. They are
        asked to leave, or killed when a step may still be running (`step_running`: a message now
        would interleave with its collectives)."""
        if self.ranks is None:
            return
        if step_running:
            self.ranks.abandon()
        else:
            self.ranks.stop(self.channel.send_shutdown)

    def _make_backend(self, num_blocks: int) -> AttentionBackend:
        return self.loaded.make_backend(num_blocks, self.config.block_size, self.config.attention_backend)

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
        beam = request.sampling.beam
        if beam is not None and self._beam_blocks(request, beam.width) > self.block_manager.num_total_blocks:
            raise InvalidArgument(
                f"beam search of width {beam.width} needs room for {beam.width} beams of up to {total} tokens "
                f"but the KV cache holds {capacity} tokens: lower best_of / n or max_tokens"
            )

    def _beam_blocks(self, request: EngineRequest, width: int) -> int:
        """Blocks a beam search holds at most at once, so its beams can all be in the cache together (the
        search waits for every beam): the prompt once (beams share it, and a recomputed beam finds it in the
        prefix cache) plus each beam's own output blocks; with prefix caching off, every beam's everything."""
        bm = self.block_manager
        prompt, output = len(request.input_ids), request.sampling.max_new_tokens
        if not bm.enable_prefix_caching:
            return width * bm.blocks_needed(prompt + output)
        return bm.blocks_needed(prompt) + width * (bm.blocks_needed(output) + 1)

    def limits(self, prompt_len: int) -> Limits:
        """What validation allows a request with this prompt length on this engine."""
        return Limits.of_engine(
            self.config,
            prompt_len=prompt_len,
            max_model_len=self.loaded.max_model_len,
            vocab_size=self.loaded.vocab_size,
            processors=self.processors,
        )

    def add_request(self, request: EngineRequest, priority: int = 0) -> None:
        """Queue a request. A constrained one whose grammar is not compiled yet is compiled here, blocking
        (the gRPC path compiles off the step loop first, see EngineLoop.generate)."""
        if request.request_id in self._groups:
            raise InvalidArgument(f"request id {request.request_id!r} is already in use")
        self.check_fits(request)
        adapter = self.resolve_lora(request.lora_name) if request.lora_name is not None else None
        group = SequenceGroup(request, priority=priority)
        group.seqs[0].lora = adapter
        if request.sampling.beam is not None:
            group.beams = BeamSearch(request, group.seqs[0], self.loaded.eos_token_ids)
        constraint = request.sampling.constraint
        if constraint is not None:
            compiled = request.grammar if request.grammar is not None else self.grammars.compile(constraint)
            group.seqs[0].grammar = GrammarState(compiled, self.loaded.eos_token_ids)
        self._groups[request.request_id] = group
        self.scheduler.add(group.seqs[0])

    def abort(self, request_id: str, message: str = "aborted", indices: Iterable[int] = ()) -> bool:
        """Mark a request (or only the listed samples) aborted; the next step frees their blocks and emits
        their ends."""
        group = self._groups.get(request_id)
        if group is None:
            return False
        # A beam search ends as a whole: its beams are not the samples the caller numbers.
        chosen = set(indices) if group.beams is None else set()
        self._aborts_pending = True
        if not chosen:
            group.abort_message = message
        for seq in group.seqs:
            if not chosen or seq.index in chosen:
                # Also marked when the whole request ends: the scheduler leaves out aborted sequences.
                seq.abort_message = message
        return True

    # -- LoRA adapters ---------------------------------------------------------

    def _lora_manager(self) -> LoraManager:
        if self.loras is None:
            raise InvalidArgument("LoRA adapters are not enabled on this engine (start it with --enable-lora)")
        return self.loras

    def resolve_lora(self, name: str) -> LoraAdapter:
        """The loaded adapter a request names (by name, or the path it was loaded from)."""
        try:
            return self._lora_manager().resolve(name)
        except LoraError as error:
            raise InvalidArgument(str(error)) from None

    def load_lora(self, name: str, path: str) -> None:
        """Serve the PEFT adapter at `path` as `name` (/v1/load_lora_adapter); InvalidArgument naming why not."""
        if name == self.config.model_name:
            raise InvalidArgument(f"LoRA adapter name {name!r} is the base model's name")
        try:
            self._lora_manager().load(name, Path(path))
        except LoraError as error:
            raise InvalidArgument(str(error)) from None

    def unload_lora(self, name: str) -> None:
        """Stop serving `name`: new requests naming it are refused; requests already running it finish."""
        try:
            self._lora_manager().unload(name)
        except LoraError as error:
            raise InvalidArgument(str(error)) from None

    def lora_adapters(self) -> list[tuple[str, str]]:
        """(name, path) of every loaded adapter, in load order."""
        return [(a.name, str(a.path)) for a in self.loras.adapters] if self.loras is not None else []

    def has_work(self) -> bool:
        return bool(self._groups)

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
        scheduled = self.scheduler.schedule()
        ran: tuple[Batch, StepLogits] | None = None
        if scheduled.scheduled:
            pending_tokens = self._pending.tokens if self._pending is not None else None
            batch = self.runner.build_batch(scheduled.scheduled, self.block_manager, pending_tokens)
            ran = batch, self.runner.run(batch)
        outputs = self._collect()  # the previous step's tokens, while the device runs this one
        outputs += self._reap_aborted()
        if ran is not None:
            batch, logits = ran
            self.scheduler.commit(scheduled)
            self._collect_prompt_logprobs(batch, logits)
            fold_pooling(batch, logits)
            outputs += self._finish_prefill_only(scheduled.scheduled)
            outputs += self._launch(batch, logits)
        if not self.overlap:
            outputs += self._collect()
        return outputs

    def _launch(self, batch: Batch, logits: StepLogits) -> list[StepOutput]:
        """Queue the sampling of the batch's sequences still running (their forked samples join the batch);
        step the beam searches whose beams all have their logits now, emitting those that end."""
        outputs = self._step_beams(batch.sample_seqs, logits.sample)
        seqs, rows, forks = self._expand_forks(batch.sample_seqs)
        if not seqs:
            return outputs
        if self.config.skip_forward:
            self._pending = launch_counting(seqs, self.loaded.vocab_size, self.loaded.device)
            return outputs
        eos = self.loaded.eos_token_ids
        self._pending = launch_sampling(
            logits.sample, rows, seqs, eos, self.config.logprobs_mode, fused_draw=self.fused_draw
        )
        for child in forks:
            self.scheduler.add_fork(self._groups[child.request.request_id].seqs[0], child)
        return outputs

    def _step_beams(self, sampled: list[Sequence], logits: torch.Tensor) -> list[StepOutput]:
        """Hand each beam its logits row; step each search whose beams are all ready. Synchronous: the
        search reads its top continuations on the host before the next step is scheduled."""
        searches: dict[str, SequenceGroup] = {}
        for row, seq in enumerate(sampled):
            if seq.request.sampling.beam is None or seq.is_finished:
                continue
            group = self._groups[seq.request.request_id]
            assert group.beams is not None
            group.beams.offer(seq, logits[row])
            searches[group.request_id] = group
        # The copy of a forked beam's partial block; tensor-parallel ranks hold caches of their own, so
        # there the fork recomputes it instead.
        copy = self.runner.backend.kv_cache.copy_block if self.ranks is None else None
        outputs: list[StepOutput] = []
        for group in searches.values():
            assert group.beams is not None
            if group.beams.ready():
                group.beams.step(self.scheduler, copy)
                if group.beams.done:
                    outputs += self._finish_beams(group)
        return outputs

    def _finish_beams(self, group: SequenceGroup, abort: Finish | None = None) -> list[StepOutput]:
        """The n best finished beams of an ended search as samples 0 .. n-1, best first (with `abort`:
        n empty samples ending so)."""
        assert group.beams is not None
        group.beams.close(self.scheduler)
        del self._groups[group.request_id]
        return [StepOutput(group.request_id, output) for output in group.beams.outputs(abort)]

    def _collect(self) -> list[StepOutput]:
        """Postprocess the pending sampling, if any."""
        if self._pending is None:
            return []
        pending, self._pending = self._pending, None
        return self._postprocess(pending.seqs, pending.collect())

    def _expand_forks(self, sampled: list[Sequence]) -> tuple[list[Sequence], list[int], list[Sequence]]:
        """The sequences to sample and their logits rows: those of `sampled` still running (one finished
        while its step ran leaves its row unused), then the new samples of each request whose prefill just
        completed, drawing their first token from its row."""
        alive = [
            (row, seq)
            for row, seq in enumerate(sampled)
            if not seq.is_finished and seq.request.sampling.beam is None  # beams: _step_beams
        ]
        seqs, rows = [seq for _, seq in alive], [row for row, _ in alive]
        forks: list[Sequence] = []
        for row, seq in alive:
            group = self._groups[seq.request.request_id]
            if group.needs_fork(seq):
                children = group.fork()
                forks += children
                rows += [row] * len(children)
        return seqs + forks, rows, forks

    def _collect_prompt_logprobs(self, batch: Batch, logits: StepLogits) -> None:
        if logits.prompt_hidden is None:
            return
        offset = 0
        for part in batch.prompt_rows:
            seq, asked = part.seq, part.seq.request.sampling.logprobs
            if seq.is_finished:  # aborted while its step ran
                offset += part.count
                continue
            targets = seq.token_ids[part.first_target : part.first_target + part.count]
            queries = [LogprobQuery(t, asked.prompt_top_n, asked.token_ids) for t in targets]
            hidden = logits.prompt_hidden[offset : offset + part.count]
            seq.prompt_logprobs += prompt_logprobs(hidden, self.runner.compute_logits, queries)
            offset += part.count

    def _finish_prefill_only(self, scheduled: list[ScheduledSequence]) -> list[StepOutput]:
        """End the prefill-only sequences whose prompt this step completed: their prompt log-probabilities
        and pooled vector are in; they sample nothing. Reading the vector waits for this step's forward."""
        outputs = []
        for item in scheduled:
            seq = item.seq
            if not seq.prefill_only or seq.is_finished or seq.num_computed_tokens < seq.num_tokens:
                continue
            embedding = seq.pooling.result(seq.num_prompt_tokens) if seq.pooling is not None else None
            step = self._finish(seq, Finish("length"))
            outputs.append(StepOutput(step.request_id, replace(step.output, embedding=embedding)))
        return outputs

    def _reap_aborted(self) -> list[StepOutput]:
        if not self._aborts_pending:
            return []
        # Every mark abort() made is reaped below: whole requests end, marked samples finish.
        self._aborts_pending = False
        outputs = []
        for group in list(self._groups.values()):
            if group.beams is not None:
                if group.abort_message is not None:
                    outputs += self._finish_beams(group, Finish("abort", message=group.abort_message))
                continue
            if group.abort_message is not None:
                unfinished = group.unfinished
                finish = Finish("abort", message=group.abort_message)
                # Samples not forked yet never existed: the last real one ends the request.
                outputs += [
                    self._finish(seq, finish, last=i == len(unfinished) - 1) for i, seq in enumerate(unfinished)
                ]
                continue
            for seq in group.unfinished:
                if seq.abort_message is not None:
                    outputs.append(self._finish(seq, Finish("abort", message=seq.abort_message)))
        return outputs

    def _postprocess(self, seqs: list[Sequence], sampled: list[SampledToken]) -> list[StepOutput]:
        """Each sequence's newest token is sampled[i].token_id (collected): keep it or end the sequence."""
        outputs = []
        for seq, token in zip(seqs, sampled, strict=True):
            refused = token.error or self._grammar_refuses(seq, token.token_id)
            if refused:
                seq.token_ids.pop()  # not kept
                outputs.append(self._finish(seq, Finish("abort", message=refused)))
                continue
            if token.logprob is not None:
                seq.cumulative_logprob += token.logprob
            if token.logprobs is not None:
                seq.pending_logprobs.append(token.logprobs)
            finish = self._stop_condition(seq, token.token_id)
            outputs.append(self._finish(seq, finish) if finish is not None else self._emit(seq, None))
        return outputs

    @staticmethod
    def _grammar_refuses(seq: Sequence, token: int) -> str | None:
        """Advance the sequence's grammar over its new token; why not, when it cannot."""
        if seq.grammar is None or seq.grammar.accept(token):
            return None
        constraint = seq.request.sampling.constraint
        kind = constraint.kind if constraint is not None else "grammar"
        return f"token {token} does not match the {kind} constraint here (a logits processor forced it past the mask)"

    def _stop_condition(self, seq: Sequence, token: int) -> Finish | None:
        settings = seq.request.sampling
        if seq.grammar is not None and seq.grammar.terminated:
            # The grammar ended (it accepted an EOS it allows at its end): "stop" with nothing matched.
            return Finish("stop")
        if seq.num_output_tokens >= settings.min_new_tokens:
            if token in settings.stop_token_ids:
                return Finish("stop", matched_token_id=token)
            if not settings.ignore_eos and token in self.loaded.eos_token_ids:
                return Finish("stop", matched_token_id=token, eos=True)
        if seq.num_output_tokens >= settings.max_new_tokens:
            return Finish("length")
        return None

    def _finish(self, seq: Sequence, finish: Finish, *, last: bool = False) -> StepOutput:
        self.scheduler.remove(seq)
        seq.finish = finish
        group = self._groups[seq.request.request_id]
        done = last or group.is_finished
        output = self._emit(seq, finish, done)
        if done:
            del self._groups[group.request_id]
        return output

    def _emit(self, seq: Sequence, finish: Finish | None, done: bool = False) -> StepOutput:
        new = seq.token_ids[seq.num_prompt_tokens + seq.num_emitted :]  # not output_ids: that copies every output
        first_output = seq.num_emitted == 0 and seq.index == 0
        seq.num_emitted = seq.num_output_tokens
        logprobs, seq.pending_logprobs = seq.pending_logprobs, []
        output = EngineOutput(
            token_ids=new,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_output_tokens,
            cached_tokens=seq.num_cached_tokens,
            finish=finish,
            index=seq.index,
            logprobs=logprobs,
            input_logprobs=list(seq.prompt_logprobs) if first_output else [],
            cumulative_logprob=seq.cumulative_logprob,
            request_finished=done,
            hidden_states=seq.hidden_log.take() if seq.hidden_log is not None else [],
        )
        return StepOutput(seq.request.request_id, output)
