"""chat_sandbox in-process: the model's template renders exactly as transformers renders it, and a
client's template fails with its own message, never with a stray Python exception."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.tokenizer.chat_sandbox import TemplateFailed, render
from services.tokenizer.text_tokenizer import TextTokenizer

USER = {"role": "user", "content": "Hello there"}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}

# Echoes what the template sees, so the test can read back the variables it was given.
ECHO = "\n".join(
    [
        "{{ messages | tojson }}",
        "{{ tools | tojson }}",
        "{{ documents | tojson }}",
        "{{ add_generation_prompt }}",
        "{{ bos_token }}",
    ]
)


@pytest.fixture(scope="module")
def text_tokenizer(default_model_dir: Path) -> TextTokenizer:
    return TextTokenizer(default_model_dir)


def render_with(tokenizer: TextTokenizer, messages: list[dict[str, Any]], **options: Any) -> str:
    template = options.pop("template", tokenizer.chat_template)
    assert isinstance(template, str)
    arguments: dict[str, Any] = {
        "tools": None,
        "documents": None,
        "add_generation_prompt": True,
        "continue_final_message": False,
    }
    arguments.update(options)
    return render(template, messages, variables=tokenizer.template_variables, max_chars=1 << 20, **arguments)


@pytest.mark.parametrize(
    ("messages", "options"),
    [
        ([USER], {}),
        ([{"role": "system", "content": "Be brief."}, USER], {"add_generation_prompt": False}),
        (
            [USER, {"role": "assistant", "content": "Hi! How can"}],
            {"continue_final_message": True, "add_generation_prompt": False},
        ),
        ([USER, {"role": "assistant", "content": "Hi ", "reasoning_content": "greet"}], {}),
        ([USER, {"role": "assistant", "content": "", "tool_calls": [CALL]}], {"tools": [TOOL]}),
    ],
    ids=["user", "system-no-prompt", "continue-final", "reasoning", "tools"],
)
def test_the_models_template_renders_as_transformers_does(
    text_tokenizer: TextTokenizer, messages: list[dict[str, Any]], options: dict[str, Any]
) -> None:
    hf_options = {"add_generation_prompt": True, **options}
    expected = text_tokenizer._hf.apply_chat_template(messages, tokenize=False, **hf_options)
    assert render_with(text_tokenizer, messages, **options) == expected


def test_the_template_sees_the_conversation_and_the_special_tokens(text_tokenizer: TextTokenizer) -> None:
    text = render_with(text_tokenizer, [USER], template=ECHO, tools=[TOOL], documents=[{"text": "d"}])
    messages, tools, documents, prompt, bos = text.split("\n")
    assert json.loads(messages) == [USER] and json.loads(tools) == [TOOL] and json.loads(documents) == [{"text": "d"}]
    assert (prompt, bos) == ("True", "<|im_start|>")


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{% include 'other.jinja' %}", "cannot use {% include %}"),
        ("{% import 'macros.jinja' as m %}", "cannot use {% import %}"),
        ("{% from 'macros.jinja' import m %}", "cannot use {% import %}"),
        ("{% extends 'base.jinja' %}", "cannot use {% extends %}"),
        ("{{ 1 + messages }}", "TypeError: unsupported operand type(s) for +: 'int' and 'list'"),
        ("{{ 1 // 0 }}", "ZeroDivisionError: integer division or modulo by zero"),
        ("{% if %}", "syntax error (line 1)"),
        ("{{ nowhere.field }}", "'nowhere' is undefined"),
        (
            "{{ raise_exception('only user and assistant roles') }}",
            "chat template failed: only user and assistant roles",
        ),
        ("{{ ''.__class__.__mro__ }}", "access to attribute '__class__' of 'str' object is unsafe"),
        ("{% set ns = namespace(_x=1) %}", "underscore attributes"),
        ("{{ 'ab' * 600 }}", "longer than 1000 characters (--max-prompt-bytes)"),
        ("{% for i in range(600) %}ab{% endfor %}", "longer than 1000 characters (--max-prompt-bytes)"),
    ],
)
def test_a_failing_template_raises_its_own_message(template: str, message: str) -> None:
    with pytest.raises(TemplateFailed) as info:
        render(
            template,
            [USER],
            tools=None,
            documents=None,
            add_generation_prompt=True,
            continue_final_message=False,
            variables={},
            max_chars=1000,
        )
    assert message in str(info.value)
