"""Protobuf -> plain Python for the tokenizer service (chat messages, template options)."""

from __future__ import annotations

import json
from typing import Any

from turnout.errors import InvalidArgument
from turnout.struct_values import struct_to_dict
from turnout.v1 import common_pb2


def message_to_dict(message: common_pb2.ChatMessage, content_format: str = "string") -> dict[str, Any]:
    """A ChatMessage as the dict chat templates expect (OpenAI message shape). Any non-empty role
    passes, as in vLLM: the OpenAI ones, and custom roles the template may know (it raises if not).
    `content_format` (--chat-template-content-format): `openai` gives the content as a list of text
    parts, anything else as one string."""
    if not message.role:
        raise InvalidArgument("a chat message needs a role")
    entry: dict[str, Any] = {"role": message.role}
    if message.HasField("content"):
        entry["content"] = message.content
    elif message.content_parts:
        for part in message.content_parts:
            if part.type != "text":
                raise InvalidArgument(f"content part type {part.type!r} is not supported (only 'text')")
        # Templates differ in list support; joined text renders the same everywhere.
        entry["content"] = "\n".join(part.text for part in message.content_parts)
    else:
        entry["content"] = ""
    if content_format == "openai":
        texts = [part.text for part in message.content_parts] if message.content_parts else [entry["content"]]
        entry["content"] = [{"type": "text", "text": text} for text in texts]
    if message.HasField("name"):
        entry["name"] = message.name
    if message.tool_calls:
        entry["tool_calls"] = [
            {
                "id": call.id,
                "type": call.type or "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.HasField("tool_call_id"):
        entry["tool_call_id"] = message.tool_call_id
    if message.HasField("reasoning_content"):
        entry["reasoning_content"] = message.reasoning_content
    return entry


def _arguments(text: str) -> Any:
    """A call's arguments as templates want them: the JSON object as a dict, since Qwen, Hermes, Llama 3
    and Mistral templates write `arguments | tojson` (a string would come out quoted); text that is not a
    JSON object stays the string it was."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def template_kwargs(options: common_pb2.ChatTemplateOptions) -> dict[str, Any]:
    """The keyword arguments of TextTokenizer.render_chat for these options."""
    return {
        "add_generation_prompt": options.add_generation_prompt if options.HasField("add_generation_prompt") else True,
        "continue_final_message": options.continue_final_message,
        "chat_template": options.chat_template if options.HasField("chat_template") else None,
        "template_kwargs": struct_to_dict(options.chat_template_kwargs)
        if options.HasField("chat_template_kwargs")
        else {},
        "tools": [struct_to_dict(tool) for tool in options.tools],
        "documents": [struct_to_dict(doc) for doc in options.documents],
    }
