"""Beam search for one request: `width` live beams advance together, one token per step.

A beam is a running Sequence like any other: the scheduler decodes it in the
batch and the runner gives it a logits row. Its row is kept here until every
live beam of the request has one for its current tokens (a beam may be
behind: cut by the token budget, or preempted and recomputing; a beam with
nothing left to compute is not scheduled meanwhile). Then one step, all on
tensors for the whole request (never a Python loop over the vocabulary):

    logprobs (B, V)  = processed log_softmax of the rows (bias, penalties, bans, min_tokens)
    acc (B, V)       = logprobs + each beam's cumulative log-probability
    top K of acc     over all B * V continuations, K = max(2, 1 + stop ids) * width, so at
                     least `width` of them do not end (each beam ends on at most one per stop id)

Of the K, read best first: the first `width` that do not end become the live
beams; those among the first `width` that end (a stop id, EOS, max_new_tokens)
are scored acc / generated_length ** length_penalty (the final token counted)
and kept among the `width` best finished beams. The search stops as Hugging
Face's does (`early_stopping`: True once `width` beams finished; False when the
best live beam, scored at its current length, cannot beat the worst finished
one; "never" likewise at the longest length it may reach when length_penalty
> 0), or when no beam is left. The n best finished beams are the answer.

Sharing the KV cache: the prompt is computed once (the first beam). A parent
chosen once continues as itself; each further child of it is forked from it
(Scheduler.add_fork): its full blocks are shared by reference, and its partial
last block, which both would write next, is copied into a block of the child's
own (copy on write, done eagerly at the fork) — or, when no block is free (or
the cache cannot be copied in place, as under tensor parallelism), recomputed
by the child. Beams not chosen are freed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from services.engine.logprobs import LogprobQuery, PositionLogprobs, positions, read_logprobs
from services.engine.request import EngineOutput, EngineRequest, Finish
from services.engine.sampler import SamplerRow, sample
from services.engine.sampling_params import BeamSettings
from services.engine.scheduler import Scheduler
from services.engine.sequence import Sequence
from services.engine.step_sampler import suppressed_ids

# A finished-beam score that any real one beats (Hugging Face's stand-in for an empty slot).
_NO_SCORE = -1.0e9


@dataclass(frozen=True)
class FinishedBeam:
    output_ids: list[int]  # the final token (a stop id, or the last max_new_tokens allows) included
    cumulative_logprob: float
    score: float  # cumulative_logprob / len(output_ids) ** length_penalty
    finish: Finish
    # One per output token, when the request asked for logprobs.
    logprobs: list[PositionLogprobs] = field(default_factory=list)


@dataclass(frozen=True)
class _Candidate:
    parent: Sequence
    token_id: int
    cumulative_logprob: float
    logprobs: PositionLogprobs | None
    finish: Finish | None


class BeamSearch:
    def __init__(self, request: EngineRequest, first: Sequence, eos_token_ids: frozenset[int]) -> None:
        assert request.sampling.beam is not None, "a beam search needs beam settings"
        self.request = request
        self.settings: BeamSettings = request.sampling.beam
        self.eos_token_ids = eos_token_ids
        sampling = request.sampling
        self.stop_ids = sampling.stop_token_ids | (frozenset() if sampling.ignore_eos else eos_token_ids)
        # Live beams, best first once the search has stepped.
        self.beams: list[Sequence] = [first]
        # At most `width`, best score first.
        self.finished: list[FinishedBeam] = []
        self.done = False
        # Computes the prompt: its prefix-cache hit and prompt log-probabilities are the request's.
        self._first = first
        # seq_id -> its logits row (V,) for its current tokens.
        self._rows: dict[str, torch.Tensor] = {}
        # Hugging Face's is_early_stop_heuristic_unsatisfied: once False, it stays False.
        self._improvable = True
        self._next_index = 1

    def offer(self, seq: Sequence, logits: torch.Tensor) -> None:
        """The logits row (V,) the model just gave `seq` for its current tokens."""
        self._rows[seq.seq_id] = logits.clone()  # the step's logits buffer is reused (CUDA graphs)

    def ready(self) -> bool:
        """Every live beam has its row and its K/V in the cache (none is recomputing after preemption)."""
        return all(b.seq_id in self._rows and b.num_computed_tokens == b.num_tokens for b in self.beams)

    def step(self, scheduler: Scheduler, copy_block: Callable[[int, int], None] | None) -> None:
        """Advance every beam by one token (see the top of this file); sets `done` when the search ends."""
        candidates = self._candidates()
        width = self.settings.width
        live = [c for c in candidates if c.finish is None][:width]
        self._keep_finished([c for c in candidates[:width] if c.finish is not None])
        self._rows.clear()
        self._replace_beams(live, scheduler, copy_block)
        if live:
            self._update_improvable(live[0].cumulative_logprob)
        full = len(self.finished) == width
        self.done = not live or not self._improvable or (full and self.settings.early_stopping is True)
        if self.done:
            self.close(scheduler)

    def results(self) -> list[FinishedBeam]:
        """The n best finished beams, best first (topped up with live ones if the search was cut short)."""
        n = self.request.sampling.n
        chosen = list(self.finished[:n])
        for beam in self.beams[: n - len(chosen)]:
            chosen.append(self._finished(list(beam.output_ids), beam.cumulative_logprob, Finish("length"), []))
        return chosen

    def outputs(self, abort: Finish | None = None) -> list[EngineOutput]:
        """The answer as samples 0 .. n-1, best first, each whole in one output (with `abort`: n empty
        samples ending so); the last one ends the request."""
        sampling = self.request.sampling
        results: list[FinishedBeam | None] = [None] * sampling.n if abort is not None else list(self.results())
        outputs = []
        for i, beam in enumerate(results):
            ids = beam.output_ids if beam is not None else []
            outputs.append(
                EngineOutput(
                    token_ids=list(ids),
                    prompt_tokens=len(self.request.input_ids),
                    completion_tokens=len(ids),
                    cached_tokens=self._first.num_cached_tokens,
                    finish=beam.finish if beam is not None else abort,
                    index=i,
                    logprobs=list(beam.logprobs) if beam is not None and sampling.logprobs.any_output else [],
                    input_logprobs=list(self._first.prompt_logprobs) if i == 0 else [],
                    cumulative_logprob=beam.cumulative_logprob if beam is not None else 0.0,
                    request_finished=i == len(results) - 1,
                )
            )
        return outputs

    def close(self, scheduler: Scheduler) -> None:
        """Free every live beam's blocks (the search ended or was aborted)."""
        for beam in self.beams:
            if not beam.is_finished:
                scheduler.remove(beam)
        self._rows.clear()

    # -- one step ---------------------------------------------------------------

    def _candidates(self) -> list[_Candidate]:
        """The top K continuations of all live beams, best first, each with whether it ends the beam."""
        beams, sampling = self.beams, self.request.sampling
        rows = [
            SamplerRow(sampling, b.token_ids, b.num_prompt_tokens, None, suppressed_ids(b, self.eos_token_ids), True)
            for b in beams
        ]
        processed = sample(torch.stack([self._rows[b.seq_id] for b in beams]), rows).logprobs  # (B, V)
        assert processed is not None, "rows that want logprobs get them"
        cumulative = torch.tensor([b.cumulative_logprob for b in beams], device=processed.device)  # (B,)
        acc = processed + cumulative[:, None]  # (B, V)
        vocab = acc.shape[1]
        k = min(max(2, 1 + len(self.stop_ids)) * self.settings.width, acc.numel())
        values, flat = acc.flatten().topk(k)  # (K,) best first
        parents, tokens = flat // vocab, flat % vocab  # (K,)
        asked = sampling.logprobs
        read = None
        if asked.any_output:
            read = positions(
                read_logprobs(processed[parents], tokens, asked.top_n, [asked.token_ids] * k),
                [LogprobQuery(t, asked.top_n, asked.token_ids) for t in tokens.tolist()],
            )
        out = []
        found = zip(values.tolist(), parents.tolist(), tokens.tolist(), strict=True)
        for i, (value, parent, token) in enumerate(found):
            if value == float("-inf"):
                break  # banned everywhere from here on
            beam = beams[parent]
            out.append(_Candidate(beam, token, value, read[i] if read else None, self._ending(beam, token)))
        return out

    def _ending(self, beam: Sequence, token: int) -> Finish | None:
        """Why `token` ends `beam`, if it does (as the engine's stop rules for samples)."""
        if token in self.stop_ids:
            return Finish("stop", matched_token_id=token, eos=token in self.eos_token_ids)
        if beam.num_output_tokens + 1 >= self.request.sampling.max_new_tokens:
            return Finish("length")
        return None

    def _keep_finished(self, ended: list[_Candidate]) -> None:
        """Hugging Face's rule: new finished beams count only while improvement is possible and, with
        early_stopping True, while there are fewer than `width` of them."""
        width = self.settings.width
        if not ended or not self._improvable or (len(self.finished) == width and self.settings.early_stopping is True):
            return
        for c in ended:
            logprobs = c.parent.pending_logprobs + ([c.logprobs] if c.logprobs is not None else [])
            ids = [*c.parent.output_ids, c.token_id]
            self.finished.append(self._finished(ids, c.cumulative_logprob, c.finish, logprobs))
        # Stable: of equal scores the earlier finished beam stays ahead.
        self.finished = sorted(self.finished, key=lambda b: -b.score)[:width]

    def _finished(
        self, ids: list[int], cumulative: float, finish: Finish | None, logprobs: list[PositionLogprobs]
    ) -> FinishedBeam:
        assert finish is not None
        score = cumulative / len(ids) ** self.settings.length_penalty
        return FinishedBeam(ids, cumulative, score, finish, logprobs)

    def _update_improvable(self, best_cumulative: float) -> None:
        """Whether the best live beam could still beat the worst finished one (Hugging Face's heuristic)."""
        settings = self.settings
        length = self.beams[0].num_output_tokens  # every live beam's length, its new token included
        if settings.early_stopping == "never" and settings.length_penalty > 0.0:
            length = self.request.sampling.max_new_tokens
        best_possible = best_cumulative / length**settings.length_penalty
        worst = self.finished[-1].score if len(self.finished) == settings.width else _NO_SCORE
        self._improvable = self._improvable and best_possible > worst

    def _replace_beams(
        self, live: list[_Candidate], scheduler: Scheduler, copy_block: Callable[[int, int], None] | None
    ) -> None:
        """Make `live` the beams: free the parents none continues, fork a parent chosen more than once,
        then append each beam's new token."""
        chosen = {id(c.parent) for c in live}
        for beam in self.beams:
            if id(beam) not in chosen:
                scheduler.remove(beam)  # first, so its blocks can hold the forks' copied tails
        continuing: set[int] = set()
        beams: list[Sequence] = []
        for c in live:
            if id(c.parent) in continuing:
                beams.append(self._fork(c.parent, scheduler, copy_block))
            else:
                continuing.add(id(c.parent))
                beams.append(c.parent)
        # Only now the tokens: a fork shares its parent's tokens before the parent's new one.
        for beam, c in zip(beams, live, strict=True):
            beam.token_ids.append(c.token_id)
            beam.cumulative_logprob = c.cumulative_logprob
            if c.logprobs is not None:
                beam.pending_logprobs.append(c.logprobs)
        self.beams = beams

    def _fork(self, parent: Sequence, scheduler: Scheduler, copy_block: Callable[[int, int], None] | None) -> Sequence:
        child = Sequence(
            parent.request,
            priority=parent.priority,
            index=self._next_index,
            token_ids=list(parent.token_ids),
            num_cached_tokens=parent.num_cached_tokens,
            pending_logprobs=list(parent.pending_logprobs),
            cumulative_logprob=parent.cumulative_logprob,
            lora=parent.lora,
        )
        self._next_index += 1
        scheduler.add_fork(parent, child, num_tokens=parent.num_computed_tokens, copy_block=copy_block)
        return child
