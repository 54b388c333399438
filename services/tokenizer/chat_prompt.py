"""A conversation to its prompt text: the options checked here, the template rendered in a worker.

Every chat render, the model's own template included, runs in the RenderPool:
the messages are the client's, and the model's template is only as fast as
the messages let it be, so nothing that renders runs on the event loop.
"""

from __future__ import annotations

from typing import Any

from services.tokenizer.render_pool import RenderPool
from turnout.errors import InvalidArgument

# Names the service sets for the template. chat_template_kwargs may set the flags and lists to values of the
# right type (as if given as request fields); `messages` only comes from the request's messages.
_RESERVED_FLAGS = ("add_generation_prompt", "continue_final_message")
_RESERVED_LISTS = ("tools", "documents")


class ChatPrompt:
    def __init__(self, pool: RenderPool, template: str | dict[str, str] | None, variables: dict[str, Any]) -> None:
        """`template`: the server's (one, or several by name as in tokenizer_config.json); `variables`: what
        every render sees besides the conversation (the special tokens, as transformers passes them)."""
        self._pool = pool
        self._template = template
        self._variables = variables

    async def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        max_chars: int,
    ) -> str:
        """The prompt text of the conversation, at most `max_chars` characters."""
        kwargs = dict(template_kwargs or {})
        if "messages" in kwargs:
            raise InvalidArgument("chat_template_kwargs may not set 'messages': the request's messages are rendered")
        for name in _RESERVED_FLAGS:
            if name in kwargs:
                value = kwargs.pop(name)
                if not isinstance(value, bool):
                    raise InvalidArgument(f"chat_template_kwargs '{name}' must be a boolean, got {_kind(value)}")
                if name == "add_generation_prompt":
                    add_generation_prompt = value
                else:
                    continue_final_message = value
        lists: dict[str, list[Any] | None] = {"tools": tools or None, "documents": documents or None}
        for name in _RESERVED_LISTS:
            if name in kwargs:
                value = kwargs.pop(name)
                if value is not None and not (isinstance(value, list) and all(isinstance(v, dict) for v in value)):
                    raise InvalidArgument(
                        f"chat_template_kwargs '{name}' must be a list of objects, got {_kind(value)}"
                    )
                lists[name] = value or None
        if not messages:
            raise InvalidArgument("messages must not be empty")
        if add_generation_prompt and continue_final_message:
            raise InvalidArgument("add_generation_prompt and continue_final_message cannot both be true")
        if continue_final_message and messages[-1].get("role") != "assistant":
            raise InvalidArgument("continue_final_message needs the last message to be from the assistant")
        source = self._template_named(chat_template) or self._default_template(has_tools=lists["tools"] is not None)
        return await self._pool.render(
            {
                "source": source,
                "messages": messages,
                "tools": lists["tools"],
                "documents": lists["documents"],
                "add_generation_prompt": add_generation_prompt,
                "continue_final_message": continue_final_message,
                "variables": {**self._variables, **kwargs},
                "max_chars": max_chars,
            }
        )

    def _template_named(self, chat_template: str | None) -> str | None:
        """The request's template: its text, or the name of one of the model's templates."""
        if isinstance(self._template, dict) and chat_template in self._template:
            return self._template[chat_template]
        return chat_template

    def _default_template(self, *, has_tools: bool) -> str:
        template = self._template
        if template is None:
            raise InvalidArgument("this model has no chat template; pass one with chat_template")
        if isinstance(template, str):
            return template
        # Several named templates (as transformers chooses): `tool_use` for requests with tools, else `default`.
        if has_tools and "tool_use" in template:
            return template["tool_use"]
        if "default" in template:
            return template["default"]
        raise InvalidArgument(f"this model has several chat templates and no default ({sorted(template)}); pass one")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )
