"""Log-probabilities of chosen tokens, their top alternatives and requested ids, from (R, V) log-prob rows.

gather() does it at once; the engine's sampling splits it: read_logprobs queues the reads on the device,
positions() turns their host copies into results once the tokens are known on the host.

Output positions use the sampler's distribution (after bias, penalties, masks
and temperature; `--logprobs-mode processed`, the default) or the model's raw
distribution (`raw`). Prompt positions always use the raw distribution, as in
vLLM: there is nothing to process before a token is generated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Prompt rows are turned into logits this many at a time: (rows, V) float32 for V = 150k is ~300 MB at 512.
PROMPT_ROWS_PER_CHUNK = 256


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    # 1-based rank in the position's distribution (1 = most likely).
    rank: int


@dataclass(frozen=True)
class PositionLogprobs:
    token: TokenLogprob
    top: tuple[TokenLogprob, ...] = ()
    requested: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class LogprobQuery:
    """What one row asks for: the token at the position, top_n alternatives, and listed ids."""

    token_id: int
    top_n: int = 0
    requested: tuple[int, ...] = ()


@dataclass(frozen=True)
class LogprobTensors:
    """What gather() reads from (R, V) log-probability rows, still as tensors: on the rows' device until
    to_host(), so the reads can be queued without waiting for the device."""

    chosen: torch.Tensor  # (R,) log-probability of each row's target token
    ranks: torch.Tensor  # (R,) 1 + tokens strictly more likely (ties share the better rank)
    top_values: torch.Tensor | None  # (R, k) the k most likely, k = the largest top_n asked; None: k = 0
    top_ids: torch.Tensor | None  # (R, k)
    requested_values: torch.Tensor | None  # (R, W) listed ids, padded to the longest list; None: none listed
    requested_ranks: torch.Tensor | None  # (R, W)

    def to_host(self) -> LogprobTensors:
        """The same values on the host. From a CUDA device the copies are only queued (into pinned memory):
        read them once an event recorded after this call has completed."""

        def copy(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to("cpu", non_blocking=True)

        return LogprobTensors(
            self.chosen.to("cpu", non_blocking=True),
            self.ranks.to("cpu", non_blocking=True),
            copy(self.top_values),
            copy(self.top_ids),
            copy(self.requested_values),
            copy(self.requested_ranks),
        )


def read_logprobs(
    logprobs: torch.Tensor,  # (R, V) float32 log-probabilities
    targets: torch.Tensor,  # (R,) int64 on the same device: each row's token
    top_n: int,  # alternatives to read per row (the largest any row asks for)
    requested: Sequence[tuple[int, ...]],  # ids whose log-probabilities each row asks for
) -> LogprobTensors:
    """Queue the reads on the rows' device; nothing waits for it."""
    device = logprobs.device
    chosen = logprobs.gather(1, targets[:, None])  # (R, 1)
    ranks = (logprobs > chosen).sum(dim=1) + 1  # (R,)
    k = min(top_n, logprobs.shape[1])
    top_values, top_ids = logprobs.topk(k, dim=1) if k else (None, None)  # (R, k)
    width = max((len(ids) for ids in requested), default=0)
    requested_values = requested_ranks = None
    if width:
        ids = torch.tensor([list(r) + [0] * (width - len(r)) for r in requested], device=device)  # (R, W)
        requested_values = logprobs.gather(1, ids)  # (R, W)
        requested_ranks = (logprobs[:, None, :] > requested_values[:, :, None]).sum(dim=2) + 1  # (R, W)
    return LogprobTensors(chosen.squeeze(1), ranks, top_values, top_ids, requested_values, requested_ranks)


def positions(read: LogprobTensors, queries: Sequence[LogprobQuery]) -> list[PositionLogprobs]:
    """Host reads, one query per row (its token_id the row's target) -> one PositionLogprobs per row."""
    chosen_list = read.chosen.tolist()
    ranks_list = read.ranks.tolist()
    top_v = read.top_values.tolist() if read.top_values is not None else None
    top_i = read.top_ids.tolist() if read.top_ids is not None else None
    req_v = read.requested_values.tolist() if read.requested_values is not None else None
    req_r = read.requested_ranks.tolist() if read.requested_ranks is not None else None
    out = []
    for row, query in enumerate(queries):
        top: tuple[TokenLogprob, ...] = ()
        if query.top_n and top_v is not None and top_i is not None:
            top = tuple(
                TokenLogprob(top_i[row][j], top_v[row][j], j + 1) for j in range(min(query.top_n, len(top_i[row])))
            )
        requested: tuple[TokenLogprob, ...] = ()
        if query.requested and req_v is not None and req_r is not None:
            requested = tuple(
                TokenLogprob(token_id, req_v[row][j], req_r[row][j]) for j, token_id in enumerate(query.requested)
            )
        out.append(PositionLogprobs(TokenLogprob(query.token_id, chosen_list[row], ranks_list[row]), top, requested))
    return out


def gather(logprobs: torch.Tensor, queries: Sequence[LogprobQuery]) -> list[PositionLogprobs]:
    """logprobs (R, V) float32 log-probabilities, one query per row -> one PositionLogprobs per row."""
    if not queries:
        return []
    targets = torch.tensor([q.token_id for q in queries], dtype=torch.int64, device=logprobs.device)  # (R,)
    read = read_logprobs(logprobs, targets, max(q.top_n for q in queries), [q.requested for q in queries])
    return positions(read, queries)


def prompt_logprobs(
    hidden: torch.Tensor,  # (R, hidden) final hidden states of prompt positions p .. p+R-1
    compute_logits: object,
    queries: Sequence[LogprobQuery],  # one per row: the prompt token at position p+1+row
) -> list[PositionLogprobs]:
    """Raw log-probabilities of prompt tokens, a chunk of rows at a time to bound memory."""
    out: list[PositionLogprobs] = []
    for start in range(0, len(queries), PROMPT_ROWS_PER_CHUNK):
        stop = start + PROMPT_ROWS_PER_CHUNK
        logits = compute_logits(hidden[start:stop])  # type: ignore[operator]  # (r, V)
        out += gather(torch.log_softmax(logits.float(), dim=-1), queries[start:stop])
    return out
