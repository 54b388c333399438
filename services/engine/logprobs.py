"""Log-probabilities of chosen tokens, their top alternatives and requested ids, from (R, V) log-prob rows.

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


def gather(logprobs: torch.Tensor, queries: Sequence[LogprobQuery]) -> list[PositionLogprobs]:
    """logprobs (R, V) float32 log-probabilities, one query per row -> one PositionLogprobs per row."""
    if not queries:
        return []
    device = logprobs.device
    targets = torch.tensor([q.token_id for q in queries], dtype=torch.int64, device=device)  # (R,)
    chosen = logprobs.gather(1, targets[:, None])  # (R, 1)
    # Rank = 1 + tokens strictly more likely; ties share the better rank.
    ranks = (logprobs > chosen).sum(dim=1) + 1  # (R,)
    k = min(max(q.top_n for q in queries), logprobs.shape[1])
    top_values, top_ids = logprobs.topk(k, dim=1) if k else (None, None)  # (R, k)
    width = max(len(q.requested) for q in queries)
    requested_values = None
    if width:
        ids = torch.tensor([list(q.requested) + [0] * (width - len(q.requested)) for q in queries], device=device)
        requested_values = logprobs.gather(1, ids)  # (R, width)
        requested_ranks = (logprobs[:, None, :] > requested_values[:, :, None]).sum(dim=2) + 1  # (R, width)

    chosen_list = chosen.squeeze(1).tolist()
    ranks_list = ranks.tolist()
    top_v = top_values.tolist() if top_values is not None else None
    top_i = top_ids.tolist() if top_ids is not None else None
    req_v = requested_values.tolist() if requested_values is not None else None
    req_r = requested_ranks.tolist() if requested_values is not None else None
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
