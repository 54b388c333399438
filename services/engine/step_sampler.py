"""One step's sampling: logits rows -> a token per sequence, with the log-probabilities asked for.

In two halves, so the engine can overlap them with other work (see llm_engine.py):

- launch_sampling builds the sampler's rows (stop and EOS ids are suppressed
  until min_new_tokens) and the stage-4 hooks the batch needs (the grammar
  bitmask for constrained rows, then the logits processors; none at all for a
  batch without either, so greedy-only batches keep their single argmax), and
  queues the batched sampler on the device. Each sequence gets a placeholder
  for its token (sequence.py); the tokens stay on the device.
  Log-probabilities are read in one batched pass, on the device too, for the
  rows that need them: requests asking for logprobs, and requests with several
  samples (best_of ranks them by cumulative log-probability). Copies of the
  tokens and those reads to the host are queued right behind.
- PendingSample.collect waits for those copies only (not for whatever the
  device was given since), fills in the placeholders and hands back one
  SampledToken per sequence.

Failures the hooks find (no token left by the grammar, a failing logits
processor) are known at launch and handed back at collect with the tokens.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from services.engine.grammar.bitmask import GrammarMask
from services.engine.logprobs import LogprobQuery, LogprobTensors, PositionLogprobs, positions, read_logprobs
from services.engine.processors.hook import ProcessorHook, uses_processors
from services.engine.sampler import LogitsHook, SamplerRow, sample
from services.engine.sequence import Sequence, placeholder


@dataclass(slots=True)  # one per sequence per step: see request.EngineOutput on why not frozen
class SampledToken:
    token_id: int
    # The sampled token's log-probability, when the request needs it (logprobs or best_of).
    logprob: float | None = None
    # What the request asked for, when it asked.
    logprobs: PositionLogprobs | None = None
    # Set when the row could not be sampled (no token left by the grammar, a failing logits
    # processor): the sequence ends with an Abort carrying it, and token_id is meaningless.
    error: str | None = None


def suppressed_ids(seq: Sequence, eos_token_ids: frozenset[int]) -> list[int]:
    """Stop ids (and EOS unless ignore_eos) are masked until min_new_tokens are generated."""
    settings = seq.request.sampling
    if seq.num_output_tokens >= settings.min_new_tokens:
        return []
    stops = settings.stop_token_ids | (frozenset() if settings.ignore_eos else eos_token_ids)
    return sorted(stops)


def _needs_logprob(seq: Sequence) -> bool:
    settings = seq.request.sampling
    # Samples of a multi-sample request carry their cumulative log-probability (best_of ranks by it).
    return settings.logprobs.sampled or settings.best_of > 1


@dataclass(frozen=True)
class PendingSample:
    """A launched sampling: its tokens are on the device (and on their way to the host), and
    seqs[i].token_ids[-1] is placeholder(i) until collect() fills it in."""

    seqs: list[Sequence]
    tokens: torch.Tensor  # (N,) int64 on the device, row i for seqs[i]
    # Host copies, queued right behind the sampling: later work on the device (the next step's forward
    # pass) does not delay them.
    host_tokens: torch.Tensor  # (N,)
    # Rows whose log-probabilities were read, and the reads (P rows).
    logprob_rows: list[int]
    host_logprobs: LogprobTensors | None
    # Completes once the host copies have landed (CUDA); None where copies are done when queued.
    copied: torch.cuda.Event | None
    # Row -> why it could not be sampled (known when the hooks ran).
    failed: dict[int, str]

    def collect(self) -> list[SampledToken]:
        """Wait for the host copies (the step's one wait for the device), fill in the placeholders: one
        SampledToken per sequence, in order, with the log-probabilities asked for."""
        if self.copied is not None:
            self.copied.synchronize()
        token_ids: list[int] = self.host_tokens.tolist()
        for row, (seq, token) in enumerate(zip(self.seqs, token_ids, strict=True)):
            assert seq.token_ids[-1] == placeholder(row), "a pending token is always its sequence's newest"
            seq.token_ids[-1] = token
        gathered: dict[int, PositionLogprobs] = {}
        if self.host_logprobs is not None:
            queries = []
            for i in self.logprob_rows:
                asked = self.seqs[i].request.sampling.logprobs
                queries.append(LogprobQuery(token_ids[i], asked.top_n, asked.token_ids))
            gathered = dict(zip(self.logprob_rows, positions(self.host_logprobs, queries), strict=True))
        out = []
        for i, token in enumerate(token_ids):
            position = gathered.get(i)
            if position is None:
                out.append(SampledToken(token, error=self.failed.get(i)))
                continue
            shown = self.seqs[i].request.sampling.logprobs.sampled
            out.append(SampledToken(token, position.token.logprob, position if shown else None, self.failed.get(i)))
        return out


def launch_sampling(
    logits: torch.Tensor,  # (R, V) float32, one row per distinct sampled position
    rows: Seq[int],  # logits row of each sequence (forked samples share their parent's row)
    seqs: Seq[Sequence],
    eos_token_ids: frozenset[int],
    logprobs_mode: str = "processed",
    fused_draw: bool | None = None,  # see sampler.sample
) -> PendingSample:
    """Queue the step's sampling and log-probability reads on the logits' device, and their copies to the
    host; append each sequence's placeholder.

    Reads the sequences' histories (penalties, grammar, processors), so their tokens must all be real."""
    device = logits.device
    if len(rows) != logits.shape[0] or list(rows) != list(range(len(rows))):
        logits = logits[torch.tensor(list(rows), device=device)]  # (N, V)
    want = [_needs_logprob(seq) for seq in seqs]
    sampler_rows = [
        SamplerRow(
            settings=seq.request.sampling,
            token_ids=seq.token_ids,
            num_prompt_tokens=seq.num_prompt_tokens,
            generator=seq.generator,
            suppressed_ids=suppressed_ids(seq, eos_token_ids),
            want_logprobs=wanted and logprobs_mode == "processed",
        )
        for seq, wanted in zip(seqs, want, strict=True)
    ]
    hooks: list[LogitsHook] = []
    grammar = GrammarMask([seq.grammar for seq in seqs]) if any(seq.grammar for seq in seqs) else None
    if grammar is not None:
        hooks.append(grammar)
    processors = ProcessorHook() if any(uses_processors(row) for row in sampler_rows) else None
    if processors is not None:
        hooks.append(processors)
    result = sample(logits, sampler_rows, hooks, fused_draw)
    failed = {**(processors.failed if processors else {}), **(grammar.failed if grammar else {})}

    picked = [i for i, wanted in enumerate(want) if wanted]
    host_logprobs = None
    if picked:
        index = torch.tensor(picked, device=device)  # (P,)
        if logprobs_mode == "processed":
            assert result.logprobs is not None, "the sampler returns logprobs for rows that want them"
            source = result.logprobs[index]  # (P, V)
        else:
            source = torch.log_softmax(logits[index].float(), dim=-1)  # (P, V)
        asked = [seqs[i].request.sampling.logprobs for i in picked]
        top_n = max(a.top_n for a in asked)
        read = read_logprobs(source, result.tokens[index], top_n, [a.token_ids for a in asked])
        host_logprobs = read.to_host()
    host_tokens = result.tokens.to("cpu", non_blocking=True)
    copied = None
    if device.type == "cuda":
        copied = torch.cuda.Event()
        copied.record()
    for row, seq in enumerate(seqs):
        seq.token_ids.append(placeholder(row))
    return PendingSample(list(seqs), result.tokens, host_tokens, picked, host_logprobs, copied, failed)
