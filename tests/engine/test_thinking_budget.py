"""The thinking budget on a tiny random model with <think> / </think> special tokens.

`</think>` gets a logit bias of -100 so the random model never closes the block by itself (the
forced close still wins: forcing leaves it the only finite logit), which makes every count exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.engine.processors.thinking_budget import ThinkTokens, forced_token
from tests.models import THINK_END, THINK_START
from turnout import LLM
from turnout.errors import InvalidArgument


@pytest.fixture(scope="module")
def llm(tiny_thinking_model_dir: Path) -> LLM:
    return LLM(tiny_thinking_model_dir, num_kv_blocks=256)


@pytest.fixture(scope="module")
def think(llm: LLM) -> ThinkTokens:
    vocab = llm.engine.vocab
    start, end = vocab.token_id(THINK_START), vocab.token_id(THINK_END)
    assert start is not None and end is not None
    return ThinkTokens(start, end, vocab.newline_id, vocab.newline_ending_ids)


def chat_prompt(llm: LLM, text: str, *, prefill: bool = True) -> list[int]:
    """The chat template's prompt; prefill=False drops the template's pre-filled `<think>\\n`."""
    rendered = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    assert rendered.endswith("<think>\n")
    if not prefill:
        rendered = rendered.removesuffix("<think>\n")
    return list(llm.tokenizer.encode(rendered, add_special_tokens=False))


def params(think: ThinkTokens, **extra: Any) -> dict[str, Any]:
    return {"temperature": 0, "ignore_eos": True, "logit_bias": {str(think.end): -100.0}, **extra}


def check_close(out: list[int], last_before: int, budget: int, think: ThinkTokens, first: int = 0) -> int:
    """Assert exactly `budget` thinking tokens from output[first], then the forced close; return where
    the answer starts."""
    thinking = out[first : first + budget]
    assert think.end not in thinking and len(thinking) == budget
    previous = thinking[-1] if thinking else last_before
    at = first + budget
    if previous in think.newline_ending:
        assert out[at] == think.end
        return at + 1
    assert out[at : at + 2] == [think.newline, think.end]
    return at + 2


@pytest.mark.parametrize("budget", [0, 1, 16])
def test_budget_forces_a_clean_close_after_exactly_budget_tokens(llm: LLM, think: ThinkTokens, budget: int) -> None:
    prompt = chat_prompt(llm, "Why is the sky blue?")
    out = llm.generate([prompt], params(think, thinking_budget=budget, max_new_tokens=budget + 12))[0]
    answer = check_close(out.output_token_ids, prompt[-1], budget, think)
    # After the close the model is free: the rest is what it generates from there without any budget.
    rest = out.output_token_ids[answer:]
    prefix = prompt + out.output_token_ids[:answer]
    free = llm.generate([prefix], params(think, max_new_tokens=len(rest)))[0]
    assert rest and free.output_token_ids == rest


def test_without_a_budget_nothing_is_forced(llm: LLM, think: ThinkTokens) -> None:
    prompt = chat_prompt(llm, "Why is the sky blue?")
    out = llm.generate([prompt], params(think, max_new_tokens=24))[0]
    assert think.end not in out.output_token_ids


def test_forced_close_on_a_newline_ending_token_skips_the_newline(think: ThinkTokens) -> None:
    prompt = [5, think.start, think.newline]  # "<think>\n" pre-filled
    assert forced_token(prompt, [], 0, think) == think.end
    plain = next(t for t in range(100, 2000) if t not in think.newline_ending)
    ends_in_newline = next(t for t in sorted(think.newline_ending) if t != think.newline)
    assert forced_token(prompt, [plain, plain], 2, think) == think.newline
    assert forced_token(prompt, [plain, plain, think.newline], 2, think) == think.end
    assert forced_token(prompt, [plain, ends_in_newline], 2, think) == think.end
    assert forced_token(prompt, [plain, think.end, plain, plain], 1, think) is None  # closed by the model
    assert forced_token([5, think.start, 7, think.end], [plain] * 5, 1, think) is None  # no block open


def test_model_generated_start_tag_starts_the_count_after_it(llm: LLM, think: ThinkTokens) -> None:
    prompt = chat_prompt(llm, "Hello", prefill=False)
    bias = {str(think.start): 100.0, str(think.end): -100.0}  # the model "chooses" to think
    out = llm.generate([prompt], {**params(think), "logit_bias": bias, "thinking_budget": 3, "max_new_tokens": 10})[0]
    ids = out.output_token_ids
    assert ids[0] == think.start
    answer = check_close(ids, ids[0], 3, think, first=1)
    assert ids[answer:] == [think.start] * (len(ids) - answer)  # no second close: only the first block counts


def test_mixed_batch_n_and_sglang_style(llm: LLM, think: ThinkTokens) -> None:
    prompt = chat_prompt(llm, "Count to ten")
    other = chat_prompt(llm, "Name a colour")
    solo = llm.generate([other], params(think, max_new_tokens=20))[0].output_token_ids
    budgeted, free, sglang, both = llm.generate(
        [prompt, other, prompt, prompt],
        [
            params(think, thinking_budget=4, max_new_tokens=20, n=2, temperature=1.0, seed=3),
            params(think, max_new_tokens=20),
            params(
                think, custom_logit_processor="thinking_budget", custom_params={"thinking_budget": 5}, max_new_tokens=20
            ),
            params(
                think,
                thinking_budget=2,
                custom_logit_processor="thinking_budget",
                custom_params={"thinking_budget": 9},
                max_new_tokens=20,
            ),
        ],
    )
    for sample in budgeted.samples:
        check_close(sample.output_token_ids, prompt[-1], 4, think)
    assert free.output_token_ids == solo  # an unbudgeted request beside budgeted ones is untouched
    check_close(sglang.output_token_ids, prompt[-1], 5, think)
    check_close(both.output_token_ids, prompt[-1], 2, think)  # the field wins over custom_params


def test_refused_when_the_model_has_no_think_tokens(tiny_model_dir: Path) -> None:
    plain = LLM(tiny_model_dir, num_kv_blocks=64)
    with pytest.raises(InvalidArgument, match=r"thinking_budget is not supported by this model.*'<think>'"):
        plain.generate("hi", {"thinking_budget": 8, "max_new_tokens": 4})
    assert not plain.engine.has_work()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"thinking_budget": 4, "regex": "[0-9]+"}, "thinking_budget cannot be combined"),
        (
            {"custom_logit_processor": "thinking_budget", "custom_params": {"thinking_budget": -1}},
            "thinking_budget must be >= 0",
        ),
        (
            {"custom_logit_processor": "thinking_budget", "custom_params": {"thinking_budget": "many"}},
            "custom_params.thinking_budget must be an integer",
        ),
    ],
)
def test_bad_budgets_are_refused(llm: LLM, extra: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        llm.generate("hi", {"max_new_tokens": 4, **extra})


async def test_streamed_through_the_engine_loop(llm: LLM, think: ThinkTokens) -> None:
    """The forced tokens are ordinary output tokens: they stream in chunks like any other."""
    from services.engine.engine_loop import EngineLoop
    from services.engine.request import EngineRequest
    from services.engine.sampling_validation import resolve
    from turnout.v1 import common_pb2

    prompt = chat_prompt(llm, "Stream please")
    sp = common_pb2.SamplingParams(temperature=0, ignore_eos=True, max_new_tokens=10, thinking_budget=3)
    sp.logit_bias[think.end] = -100.0
    settings = resolve(sp, common_pb2.SamplingParams(), llm.engine.limits(len(prompt)))
    request = EngineRequest("stream", tuple(prompt), settings)
    loop = EngineLoop(llm.engine)
    try:
        chunks = [out.token_ids async for out in loop.generate(request)]
    finally:
        loop.shutdown()
    assert len(chunks) >= 5  # one step, one chunk
    check_close([t for chunk in chunks for t in chunk], prompt[-1], 3, think)
