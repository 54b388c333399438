"""The draw: seeded reproducibility across batch compositions, the documented per-step generator
consumption, statistical sanity, logprobs, greedy rows and the all-greedy fast path."""

from __future__ import annotations

from collections import Counter

import torch

from services.engine.sampler import SamplerRow, sample
from services.engine.sampler.batch import SamplerBatch
from services.engine.sampling_params import SamplingSettings
from tests.engine.test_sampler_support import (
    assert_frequencies,
    log_softmax,
    logits_of,
    renormalised,
    row,
    settings,
)

V = 64
EVERYTHING = settings(
    temperature=0.9,
    top_k=40,
    top_p=0.95,
    min_p=0.01,
    typical_p=0.97,
    tfs=0.99,
    top_a=0.05,
    eta_cutoff=1.0,
    epsilon_cutoff=1.0,
    smoothing_factor=0.8,
    xtc_threshold=0.03,
    xtc_probability=0.5,
    repetition_penalty=1.1,
    frequency_penalty=0.2,
    dry_multiplier=0.5,
    dynatemp_min=0.7,
    dynatemp_max=1.3,
    nsigma=3.0,
)


def step_logits(step: int, rows: int) -> torch.Tensor:
    """Fixed per-step logits: row 0 is the row under test, the others are noise."""
    g = torch.Generator().manual_seed(1000 + step)
    target = torch.randn(V, generator=g) * 2.5
    others = torch.randn(rows - 1, V) * 2.5
    return torch.cat([target.unsqueeze(0), others])  # (rows, V)


def run(
    target: SamplingSettings, seed: int, companions: list[SamplingSettings], position: int, steps: int
) -> list[int]:
    """Token sequence of one seeded row over `steps` steps, with companion rows around it."""
    generator = torch.Generator().manual_seed(seed)
    history = [1, 2, 3]
    companion_gens = [torch.Generator().manual_seed(77 + i) if i % 2 else None for i in range(len(companions))]
    tokens: list[int] = []
    torch.manual_seed(position * 31 + len(companions))  # the default RNG must not matter
    for step in range(steps):
        logits = step_logits(step, len(companions) + 1)
        rows: list[SamplerRow] = [
            row(s, [5, 6, step % V], generator=g, want_logprobs=bool(i % 3))
            for i, (s, g) in enumerate(zip(companions, companion_gens, strict=True))
        ]
        order = list(range(1, len(companions) + 1))
        order.insert(position, 0)
        rows.insert(position, row(target, history, num_prompt_tokens=3, generator=generator))
        out = sample(logits[order], rows)
        token = out.token_ids[position]
        tokens.append(token)
        history.append(token)
    return tokens


COMPANIONS = [
    settings(temperature=0.0),
    settings(temperature=1.3),  # no truncation: keeps the whole vocabulary wide
    EVERYTHING,
    settings(top_k=3, xtc_probability=1.0),
    settings(temperature=0.0, repetition_penalty=1.5),
    settings(top_p=0.5),
]


def test_seeded_row_draws_the_same_tokens_in_any_batch() -> None:
    steps = 30
    alone = run(EVERYTHING, 5, [], 0, steps)
    assert len(set(alone)) > 3, "the row must actually sample"
    assert run(EVERYTHING, 5, COMPANIONS, 3, steps) == alone
    assert run(EVERYTHING, 5, COMPANIONS[::-1], 0, steps) == alone
    assert run(EVERYTHING, 5, COMPANIONS[:2], 2, steps) == alone
    assert run(EVERYTHING, 6, COMPANIONS, 3, steps) != alone


def test_plain_seeded_row_is_reproducible_too() -> None:
    plain = settings(temperature=1.0)
    alone = run(plain, 9, [], 0, 20)
    assert run(plain, 9, COMPANIONS, 4, 20) == alone


def test_seeded_row_consumes_the_documented_draws_per_step() -> None:
    logits = torch.randn(1, V)
    for s, coin in ((settings(temperature=0.7), False), (settings(xtc_probability=0.4), True)):
        generator = torch.Generator().manual_seed(3)
        sample(logits, [row(s, generator=generator)])
        expected = torch.Generator().manual_seed(3)
        if coin:
            torch.rand(1, generator=expected)
        torch.empty(V).uniform_(generator=expected)
        assert torch.equal(generator.get_state(), expected.get_state()), s
    generator = torch.Generator().manual_seed(3)
    sample(logits, [row(settings(temperature=0.0, xtc_probability=0.4), generator=generator)])
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(3).get_state())  # greedy: nothing


def test_one_seeded_row_stepping_follows_the_top_p_distribution() -> None:
    probs = [0.35, 0.25, 0.2, 0.1, 0.06, 0.04]
    logits = logits_of(probs).unsqueeze(0)
    generator = torch.Generator().manual_seed(21)
    r = row(settings(top_p=0.7), generator=generator)
    steps = 1500
    counts = Counter(sample(logits, [r]).token_ids[0] for _ in range(steps))
    assert_frequencies(counts, renormalised(probs, {0, 1, 2}), steps)


def test_logprobs_are_taken_after_temperature_and_before_truncation() -> None:
    logits = [1.0, 0.2, -0.3, 2.0, 0.0, -1.0]
    tempered = row(settings(temperature=0.5, top_k=2, logit_bias=((2, 1.0),)), want_logprobs=True)
    greedy = row(settings(temperature=0.0, presence_penalty=1.0), [3], num_prompt_tokens=0, want_logprobs=True)
    silent = row(settings(temperature=0.7))
    out = sample(torch.tensor([logits, logits, logits]), [tempered, greedy, silent])
    assert out.logprobs is not None and out.logprobs.shape == (3, len(logits))
    biased = [x + (1.0 if t == 2 else 0.0) for t, x in enumerate(logits)]
    assert torch.allclose(out.logprobs[0], torch.tensor(log_softmax([x / 0.5 for x in biased])), atol=1e-5)
    penalised = [x - (1.0 if t == 3 else 0.0) for t, x in enumerate(logits)]
    assert torch.allclose(out.logprobs[1], torch.tensor(log_softmax(penalised)), atol=1e-5)
    assert out.token_ids[0] in (0, 3) and out.token_ids[1] == 0


def test_no_logprobs_unless_a_row_asks() -> None:
    out = sample(torch.randn(2, V), [row(settings()), row(settings(temperature=0.0))])
    assert out.logprobs is None


def test_greedy_rows_take_the_argmax_of_the_processed_logits() -> None:
    logits = torch.randn(5, V)
    rows = [row(settings(temperature=0.0), suppressed_ids=[int(logits[i].argmax())]) for i in range(5)]
    expected = logits.clone()
    expected[torch.arange(5), logits.argmax(dim=-1)] = float("-inf")
    assert sample(logits, rows).token_ids == expected.argmax(dim=-1).tolist()


def test_all_plain_greedy_takes_the_fast_path() -> None:
    logits = torch.randn(7, V)
    rows = [row(settings(temperature=0.0, top_k=5, top_p=0.5)) for _ in range(7)]  # truncation is moot
    assert SamplerBatch(rows, V, logits.device).plain_greedy
    out = sample(logits, rows)
    assert out.token_ids == logits.argmax(dim=-1).tolist() and out.logprobs is None
    for extra in (
        row(settings(temperature=0.0), suppressed_ids=[1]),
        row(settings(temperature=0.0), want_logprobs=True),
        row(settings(temperature=0.0, logit_bias=((1, 1.0),))),
        row(settings(temperature=0.0, repetition_penalty=1.2)),
        row(settings(temperature=0.5)),
    ):
        assert not SamplerBatch([*rows, extra], V, logits.device).plain_greedy


def test_the_callers_logits_are_not_modified() -> None:
    logits = torch.randn(3, V)
    before = logits.clone()
    rows = [
        row(EVERYTHING, [1, 2, 3], generator=torch.Generator().manual_seed(i), suppressed_ids=[4]) for i in range(3)
    ]
    sample(logits, rows)
    assert torch.equal(logits, before)


def test_empty_batch() -> None:
    out = sample(torch.empty(0, V), [])
    assert out.token_ids == [] and out.logprobs is None
