"""Logit bias and repetition / frequency / presence penalties: the sampler's logprobs (greedy rows,
temperature 1) must equal log_softmax of the logits edited by a per-row reference formula."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from services.engine.sampler import sample
from tests.engine.test_sampler_support import log_softmax, row, settings

LOGITS = [1.4, -0.5, 2.0, -1.2, 0.3, 0.0, 2.2, -2.0]
PROMPT = [0, 1, 1, 5]
OUTPUT = [2, 3, 2, 2, 6]


def ref_penalised(
    logits: list[float], prompt: list[int], output: list[int], rep: float, freq: float, pres: float
) -> list[float]:
    out = list(logits)
    for t in set(prompt) | set(output):
        out[t] = out[t] / rep if out[t] > 0 else out[t] * rep
    counts = Counter(output)
    for t, c in counts.items():
        out[t] -= freq * c + pres
    return out


@pytest.mark.parametrize(
    ("rep", "freq", "pres"),
    [(1.3, 0.0, 0.0), (1.0, 0.4, 0.0), (1.0, 0.0, 0.7), (1.2, 0.5, -0.3), (1.0, -0.6, 0.2)],
)
def test_penalties_match_the_reference(rep: float, freq: float, pres: float) -> None:
    s = settings(temperature=0.0, repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres)
    r = row(s, PROMPT + OUTPUT, num_prompt_tokens=len(PROMPT), want_logprobs=True)
    expected = log_softmax(ref_penalised(LOGITS, PROMPT, OUTPUT, rep, freq, pres))
    out = sample(torch.tensor([LOGITS]), [r])
    assert out.logprobs is not None
    assert torch.allclose(out.logprobs[0], torch.tensor(expected, dtype=torch.float32), atol=1e-5)
    assert out.token_ids == [max(range(len(expected)), key=expected.__getitem__)]


def test_frequency_and_presence_ignore_prompt_tokens_repetition_does_not() -> None:
    # Token 6 has the top logit and appears only in the prompt.
    prompt, output = [6, 6, 6], [1]
    fp = settings(temperature=0.0, frequency_penalty=2.0, presence_penalty=2.0)
    assert sample(torch.tensor([LOGITS]), [row(fp, prompt + output, num_prompt_tokens=3)]).token_ids == [6]
    rep = settings(temperature=0.0, repetition_penalty=2.0)
    assert sample(torch.tensor([LOGITS]), [row(rep, prompt + output, num_prompt_tokens=3)]).token_ids == [2]


def test_logit_bias_is_added_before_the_penalties() -> None:
    bias = ((3, 4.0), (6, -1.0), (99, 5.0))  # 99 is outside the vocabulary: ignored
    s = settings(temperature=0.0, logit_bias=bias, repetition_penalty=1.5)
    r = row(s, [3], want_logprobs=True)
    edited = list(LOGITS)
    edited[3] += 4.0
    edited[6] -= 1.0
    edited[3] /= 1.5  # now positive: divided
    out = sample(torch.tensor([LOGITS]), [r])
    assert out.logprobs is not None
    assert torch.allclose(out.logprobs[0], torch.tensor(log_softmax(edited), dtype=torch.float32), atol=1e-5)


def test_penalties_apply_per_row_in_a_batch() -> None:
    plain = row(settings(temperature=0.0), [6, 6], want_logprobs=True)
    penalised = row(settings(temperature=0.0, presence_penalty=1.0), [6, 6], num_prompt_tokens=0, want_logprobs=True)
    out = sample(torch.tensor([LOGITS, LOGITS]), [plain, penalised])
    assert out.logprobs is not None
    assert torch.allclose(out.logprobs[0], torch.log_softmax(torch.tensor(LOGITS), dim=-1))
    assert out.token_ids == [6, 2]
