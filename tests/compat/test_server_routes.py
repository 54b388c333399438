"""vLLM, SGLang and SageMaker routes that answered 404: /tokenizer_info, /load, /invocations, and the
audio routes, which answer a 400 saying why (no audio models), against a live stack."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tests.compat.conftest import MODEL
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.default_model]


def test_tokenizer_info_is_the_models_tokenizer(compat_stack: Stack, default_model_dir: Path) -> None:
    info = httpx.get(f"{compat_stack.base_url}/tokenizer_info", timeout=60).json()
    hf = AutoTokenizer.from_pretrained(default_model_dir)
    assert info["tokenizer_class"] == type(hf).__name__
    assert info["chat_template"] == hf.chat_template
    assert info["model_max_length"] == hf.model_max_length
    assert info["eos_token"] == hf.eos_token


def test_load_counts_the_requests_in_flight(compat_stack: Stack) -> None:
    load = httpx.get(f"{compat_stack.base_url}/load", timeout=60).json()
    assert load["server_load"] == 0  # the router's own count: exact
    assert len(load["engines"]) == 1
    # The engines' counts are as the router last polled them (docs/api.md): an earlier test's
    # request can still show until the next poll.
    deadline = time.monotonic() + 60
    while load["engines"][0]["num_reqs"] != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        load = httpx.get(f"{compat_stack.base_url}/load", timeout=60).json()
    assert load["engines"][0]["num_reqs"] == 0, load


def test_invocations_answers_as_chat_and_completions(compat_stack: Stack, client: openai.OpenAI) -> None:
    url = f"{compat_stack.base_url}/invocations"
    messages = [{"role": "user", "content": "Hi"}]
    chat = httpx.post(url, json={"messages": messages, "max_tokens": 8, "temperature": 0}, timeout=120).json()
    expected = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    assert chat["choices"][0]["message"]["content"] == expected.choices[0].message.content
    completion = httpx.post(url, json={"prompt": "The sky is", "max_tokens": 4, "temperature": 0}, timeout=120).json()
    assert completion["object"] == "text_completion"
    generated = httpx.post(url, json={"text": "The sky is", "sampling_params": {"max_new_tokens": 4}}, timeout=120)
    assert generated.json()["meta_info"]["completion_tokens"] == 4


def test_transcriptions_say_no_audio_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="does not support the Transcriptions API"):
        client.audio.transcriptions.create(model=MODEL, file=("a.wav", b"RIFF0000WAVEfmt "))
