"""Tail truncation samplers (top-n-sigma, top-k, top-p, min-p, top-a, tfs, eta, epsilon) through
sample(): the set of tokens drawn over thousands of draws must be exactly the set kept by an
independent per-row reference, with the renormalised frequencies."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from services.engine.sampler import SamplerRow, sample
from services.engine.sampler.batch import SamplerBatch
from services.engine.sampler.candidates import Candidates
from services.engine.sampler.truncation import truncate_tail
from tests.engine.test_sampler_support import (
    assert_frequencies,
    draw_counts,
    logits_of,
    renormalised,
    row,
    settings,
)

# Probabilities placed on shuffled ids so that rank order and id order differ.
RANKED = [0.32, 0.22, 0.15, 0.11, 0.08, 0.05, 0.03, 0.02, 0.01, 0.01]
IDS = [4, 0, 7, 2, 9, 1, 5, 3, 8, 6]
PROBS = [0.0] * len(RANKED)
for _rank, _id in enumerate(IDS):
    PROBS[_id] = RANKED[_rank]
ALL = set(range(len(PROBS)))
DRAWS = 4000


def by_rank(probs: list[float]) -> list[int]:
    """Ids from most to least likely, ties by id."""
    return sorted(range(len(probs)), key=lambda i: (-probs[i], i))


def ref_top_k(probs: list[float], k: int) -> set[int]:
    kth = sorted(probs, reverse=True)[k - 1]
    return {i for i, p in enumerate(probs) if p >= kth}


def ref_top_p(probs: list[float], top_p: float) -> set[int]:
    keep: set[int] = set()
    mass = 0.0
    for i in by_rank(probs):
        if keep and mass >= top_p:
            break
        keep.add(i)
        mass += probs[i]
    return keep


def ref_min_p(probs: list[float], min_p: float) -> set[int]:
    return {i for i, p in enumerate(probs) if p >= min_p * max(probs)}


def ref_top_a(probs: list[float], top_a: float) -> set[int]:
    return {i for i, p in enumerate(probs) if p >= top_a * max(probs) ** 2}


def ref_tfs(probs: list[float], z: float) -> set[int]:
    order = by_rank(probs)
    s = [probs[i] for i in order] + [0.0, 0.0]
    d2 = [abs(s[j] - 2 * s[j + 1] + s[j + 2]) for j in range(len(order))]
    total = sum(d2)
    cdf, acc = [], 0.0
    for v in d2:
        acc += v / total
        cdf.append(acc)
    return {order[j] for j in range(len(order)) if j == 0 or cdf[j - 1] <= z}


def ref_eta(probs: list[float], cutoff: float) -> set[int]:
    eta = cutoff * 1e-4
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    threshold = min(eta, math.sqrt(eta) * math.exp(-entropy))
    return {i for i, p in enumerate(probs) if p >= threshold} | {by_rank(probs)[0]}


def ref_epsilon(probs: list[float], cutoff: float) -> set[int]:
    return {i for i, p in enumerate(probs) if p >= cutoff * 1e-4} | {by_rank(probs)[0]}


def ref_nsigma(logits: list[float], n: float) -> set[int]:
    mean = sum(logits) / len(logits)
    std = math.sqrt(sum((x - mean) ** 2 for x in logits) / (len(logits) - 1))
    return {i for i, x in enumerate(logits) if x >= max(logits) - n * std}


CASES: list[tuple[str, dict[str, float], Callable[[list[float]], set[int]]]] = [
    ("top_k", {"top_k": 3}, lambda p: ref_top_k(p, 3)),
    ("top_k", {"top_k": 6}, lambda p: ref_top_k(p, 6)),
    ("top_p", {"top_p": 0.75}, lambda p: ref_top_p(p, 0.75)),
    ("top_p", {"top_p": 0.5}, lambda p: ref_top_p(p, 0.5)),
    ("min_p", {"min_p": 0.3}, lambda p: ref_min_p(p, 0.3)),
    ("min_p", {"min_p": 0.1}, lambda p: ref_min_p(p, 0.1)),
    ("top_a", {"top_a": 1.0}, lambda p: ref_top_a(p, 1.0)),
    ("top_a", {"top_a": 0.5}, lambda p: ref_top_a(p, 0.5)),
    ("tfs", {"tfs": 0.45}, lambda p: ref_tfs(p, 0.45)),
    ("tfs", {"tfs": 0.7}, lambda p: ref_tfs(p, 0.7)),
    ("eta", {"eta_cutoff": 500.0}, lambda p: ref_eta(p, 500.0)),
    ("eta", {"eta_cutoff": 2000.0}, lambda p: ref_eta(p, 2000.0)),
    ("epsilon", {"epsilon_cutoff": 600.0}, lambda p: ref_epsilon(p, 600.0)),
    ("epsilon", {"epsilon_cutoff": 1000.0}, lambda p: ref_epsilon(p, 1000.0)),
    ("nsigma", {"nsigma": 1.0}, lambda p: ref_nsigma([math.log(x) for x in p], 1.0)),
    ("nsigma", {"nsigma": 0.5}, lambda p: ref_nsigma([math.log(x) for x in p], 0.5)),
]


@pytest.mark.parametrize(("name", "fields", "reference"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_truncation_keeps_exactly_the_reference_set(
    name: str, fields: dict[str, float], reference: Callable[[list[float]], set[int]]
) -> None:
    keep = reference(PROBS)
    assert 1 <= len(keep) < len(PROBS), "the case must actually truncate"
    counts = draw_counts(logits_of(PROBS), settings(**fields), DRAWS)
    assert set(counts) == keep
    assert_frequencies(counts, renormalised(PROBS, keep), DRAWS)


def test_top_k_keeps_ties_with_the_kth_value() -> None:
    probs = [0.4, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05]
    counts = draw_counts(logits_of(probs), settings(top_k=3), DRAWS)
    assert set(counts) == {0, 1, 2, 3, 4}


def test_each_stage_sees_the_survivors_of_the_previous_renormalised() -> None:
    # After top-k 2 the survivors are 0.32/0.54 and 0.22/0.54: top-a 1.5 then drops the second
    # (0.407 < 1.5 * 0.593**2), which it would keep on the untruncated distribution.
    assert len(ref_top_a(PROBS, 1.5)) == 2
    counts = draw_counts(logits_of(PROBS), settings(top_k=2, top_a=1.5), DRAWS)
    assert set(counts) == {IDS[0]}


def test_the_most_likely_token_always_survives() -> None:
    # top_a 5 would put the threshold above p_max itself; epsilon likewise.
    for fields in ({"top_a": 5.0}, {"epsilon_cutoff": 9000.0}, {"min_p": 1.0}):
        counts = draw_counts(logits_of(PROBS), settings(**fields), 200)
        assert set(counts) == {IDS[0]}, fields


@pytest.mark.parametrize(
    "fields", [{"top_p": 0.5}, {"tfs": 0.5}, {"nsigma": 0.5}, {"top_k": 2}, {"typical_p": 0.3}, {"min_p": 0.3}]
)
def test_rows_with_the_stage_off_are_untouched_in_a_mixed_batch(fields: dict[str, float]) -> None:
    logits = logits_of(PROBS)
    generator = torch.Generator().manual_seed(3)
    on = [row(settings(**fields), generator=generator) for _ in range(DRAWS)]
    off = [row(settings(), generator=generator) for _ in range(DRAWS)]
    rows = [r for pair in zip(on, off, strict=True) for r in pair]
    out = sample(logits.unsqueeze(0).expand(len(rows), -1).contiguous(), rows)
    assert set(out.token_ids[1::2]) == ALL
    assert set(out.token_ids[0::2]) < ALL


def test_top_k_and_top_p_compaction_gives_the_same_survivors_in_a_wide_vocabulary() -> None:
    # V = 4096 with 6 meaningful tokens: top-k makes the rows narrow enough to be compacted
    # before top-p, which must then still rank ties by id and keep exactly the reference set.
    vocab = 4096
    logits = torch.full((vocab,), -30.0)
    head = {17: 2.0, 3000: 1.5, 5: 1.5, 999: 1.0, 42: 0.5, 4095: 0.0}
    for token, value in head.items():
        logits[token] = value
    probs = torch.softmax(logits.double(), dim=-1).tolist()
    keep = ref_top_p(probs, 0.7) & ref_top_k(probs, 5)
    counts = draw_counts(logits, settings(top_k=5, top_p=0.7), DRAWS)
    assert set(counts) == keep == {17, 3000, 5}
    topk_probs = [p if i in ref_top_k(probs, 5) else 0.0 for i, p in enumerate(probs)]
    assert_frequencies(counts, renormalised(topk_probs, keep), DRAWS)


def test_top_nsigma_measures_the_spread_of_live_tokens_only() -> None:
    # Suppressed tokens are -inf before truncation; the std must ignore them (not become NaN).
    probs = PROBS
    suppressed = {IDS[3], IDS[9]}
    live_logits = [math.log(p) for i, p in enumerate(probs) if i not in suppressed]
    live_ids = [i for i in range(len(probs)) if i not in suppressed]
    keep = {live_ids[j] for j in ref_nsigma(live_logits, 0.8)}
    assert len(keep) < len(live_ids)
    counts = draw_counts(logits_of(probs), settings(nsigma=0.8), DRAWS, suppressed_ids=sorted(suppressed))
    assert set(counts) == keep


def _survivors(logits: torch.Tensor, rows: list[SamplerRow]) -> list[set[int]]:
    """Token ids left finite by the tail truncation stage for each row."""
    batch = SamplerBatch(rows, logits.shape[-1], logits.device)
    c = truncate_tail(Candidates.of(logits.clone()), batch.table, batch.truncation)
    ids = c.ids if c.ids is not None else torch.arange(logits.shape[-1]).expand_as(c.values)
    return [set(ids[r][c.values[r] > float("-inf")].tolist()) for r in range(len(rows))]


def test_top_p_on_a_wide_vocabulary_skips_the_full_sort_with_the_same_survivors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Geometric probabilities over 8192 shuffled ids: the 0.9 nucleus is ~345 tokens, inside the
    # 1024-token head, so no full sort is needed; a row with top-p off forces the full sort.
    vocab = 8192
    g = torch.Generator().manual_seed(0)
    logits = (-torch.arange(vocab, dtype=torch.float32) / 150.0)[torch.randperm(vocab, generator=g)]
    probs = torch.softmax(logits.double(), dim=-1).tolist()
    keep = ref_top_p(probs, 0.9)
    assert 200 < len(keep) < 1024
    top_p_rows = [row(settings(top_p=0.9)), row(settings(top_p=0.9, min_p=0.5))]
    two = logits.unsqueeze(0).repeat(2, 1)
    with monkeypatch.context() as m:
        m.setattr(Candidates, "full_sort", lambda self: pytest.fail("full sort not expected"))
        head_path = _survivors(two, top_p_rows)
    assert head_path[0] == keep
    assert head_path[1] == ref_min_p(renormalised_list(probs, keep), 0.5)
    full_path = _survivors(logits.unsqueeze(0).repeat(3, 1), [*top_p_rows, row(settings(min_p=0.01))])
    assert full_path[:2] == head_path
    # Through sample(): 5 likely tokens and 8187 live but negligible ones.
    wide = torch.full((vocab,), -30.0)
    wide[[3, 4000, 77, 8191, 12]] = torch.tensor([2.0, 1.8, 1.5, 1.0, 0.0])
    wide_probs = torch.softmax(wide.double(), dim=-1).tolist()
    counts = draw_counts(wide, settings(top_p=0.8), DRAWS)
    assert set(counts) == ref_top_p(wide_probs, 0.8) == {3, 4000, 77}


def renormalised_list(probs: list[float], keep: set[int]) -> list[float]:
    total = sum(probs[i] for i in keep)
    return [p / total if i in keep else 0.0 for i, p in enumerate(probs)]
