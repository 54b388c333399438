"""Chat templates rendered in Jinja's immutable sandbox, with no loader and a bound on the output.

The environment is transformers' (`render_jinja_template`: trim/lstrip blocks,
loop controls, `{% generation %}`, its `tojson`, `raise_exception`,
`strftime_now`, `dict`, `namespace`), so a model's own template renders exactly
as `apply_chat_template` renders it; the differences are what makes it safe for
templates sent by clients:

- no loader: `{% include %}`, `{% import %}` and `{% extends %}` are refused when
  the template is compiled, not left to fail while rendering;
- the output is produced piece by piece and stops once it passes `max_chars`;
- every failure, whatever Python raised inside the template, is a `TemplateFailed`
  carrying the template's own message.

This module imports Jinja only: the render worker (render_worker.py) runs it in a
process of its own, which is what bounds time and memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Names a message's reasoning is passed under; the first is the one chat templates read (as transformers).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_LOADER_NODES = {jinja2.nodes.Include: "include", jinja2.nodes.Import: "import", jinja2.nodes.FromImport: "import"}


class TemplateFailed(Exception):
    """The template cannot be compiled or rendered; the message says why, in the template's words."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}` (assistant-mask markers in some templates) renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


class _TemplateDict:
    """`dict(...)` without the class itself, so templates cannot reach it (as transformers)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """Jinja's namespace refusing underscore names, which lead to CPython internals (as transformers)."""

    # Jinja's own signature trick: `namespace(self=...)` stays usable.
    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attributes ({name!r})")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


_ENV = _environment()


@lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template; a syntax error or a tag that needs a loader is a TemplateFailed."""
    try:
        tree = _ENV.parse(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateFailed(f"chat template syntax error (line {exc.lineno}): {exc.message}") from None
    if tree.find(jinja2.nodes.Extends) is not None:
        raise TemplateFailed("chat templates cannot use {% extends %}: there are no other templates to load")
    for node_type, tag in _LOADER_NODES.items():
        if tree.find(node_type) is not None:
            raise TemplateFailed(f"chat templates cannot use {{% {tag} %}}: there are no other templates to load")
    try:
        return _ENV.from_string(tree)
    except Exception as exc:  # compile errors of any kind are the template's
        raise TemplateFailed(f"chat template does not compile: {_describe(exc)}") from None


def render(
    source: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[Any] | None,
    documents: list[Any] | None,
    add_generation_prompt: bool,
    continue_final_message: bool,
    variables: dict[str, Any],
    max_chars: int,
) -> str:
    """The conversation rendered with the template `source`, at most `max_chars` characters.

    `variables` are the other names the template sees (special tokens, chat_template_kwargs);
    `continue_final_message` leaves the last (assistant) message open, as transformers does."""
    template = compile_template(source)
    chat = _alias_reasoning(messages)
    final = ""
    if continue_final_message:
        final = str(chat[-1].get("content", ""))
        if "content" not in source:
            raise TemplateFailed("continue_final_message needs a template that renders the message content")
        chat[-1] = {**chat[-1], "content": final + _CONTINUE_TAG}
    context = {**variables, "messages": chat, "tools": tools, "documents": documents}
    context["add_generation_prompt"] = add_generation_prompt
    try:
        text = _bounded_join(template.generate(context), max_chars)
    except (TemplateFailed, MemoryError, RecursionError):
        raise
    except Exception as exc:  # whatever the template raised is its error
        raise TemplateFailed(f"chat template failed: {_describe(exc)}") from None
    if continue_final_message:
        if final.strip() not in text or _CONTINUE_TAG.strip() not in text:
            raise TemplateFailed("continue_final_message: the template does not render the final message as given")
        cut = text.rindex(_CONTINUE_TAG.strip())
        # A template that strips trailing spaces also ate the tag's own space.
        text = text[:cut] if text[cut : cut + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:cut].rstrip()
    return text


def _bounded_join(pieces: Iterator[str], max_chars: int) -> str:
    out: list[str] = []
    total = 0
    for piece in pieces:
        total += len(piece)
        if total > max_chars:
            raise TemplateFailed(f"chat template output is longer than {max_chars} characters (--max-prompt-bytes)")
        out.append(piece)
    return "".join(out)


def _alias_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the messages with reasoning under every name templates read (gpt-oss reads `thinking`)."""
    aliased = []
    for message in messages:
        reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(dict(message))
    return aliased


def _describe(exc: BaseException) -> str:
    """The exception's own message, with its type when that says more (TypeError, ZeroDivisionError…)."""
    message = str(exc)
    if isinstance(exc, jinja2.TemplateError):
        return message or type(exc).__name__
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
