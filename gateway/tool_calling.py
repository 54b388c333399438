"""Chat `tools` / `tool_choice` / `parallel_tool_calls` -> the request's `ToolCalling` and template tools.

The checks are vLLM's: an empty `tools` list, a `tool_choice` other than
"none" without tools, or a named function that is not among the tools are
400s. With tools and no `tool_choice`, the choice is "auto" (OpenAI's
default); the router refuses "auto" when the server runs no tool-call parser.
How each mode produces calls (grammar for "required" and named, a parser for
"auto") is the router's and tokenizer's business; see docs/structured-outputs.md.
"""

from __future__ import annotations

from gateway.errors import invalid_request
from gateway.protocol import ChatCompletionRequest, NamedToolChoice
from turnout.v1 import common_pb2, inference_pb2

_MODES = {
    "none": common_pb2.ToolCalling.NONE,
    "auto": common_pb2.ToolCalling.AUTO,
    "required": common_pb2.ToolCalling.REQUIRED,
}


def apply_tools(req: ChatCompletionRequest, msg: inference_pb2.GenerateRequest) -> None:
    """Put the tools into the chat template options and the tool-call mode on `msg`."""
    choice = req.tool_choice
    if req.tools is None:
        if choice is not None and choice != "none":
            raise invalid_request("'tool_choice' other than 'none' requires 'tools'", "tool_choice")
        return
    if not req.tools:
        raise invalid_request("'tools' must not be empty; leave it out for no tools", "tools")
    names = [tool.function.name for tool in req.tools]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise invalid_request(f"'tools' names functions more than once: {', '.join(duplicated)}", "tools")
    for tool in req.tools:
        msg.chat.options.tools.add().update(tool.model_dump(exclude_none=True))

    calling = msg.tool_calling
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise invalid_request(
                f"tool_choice names function '{choice.function.name}', which is not in 'tools'", "tool_choice"
            )
        calling.mode = common_pb2.ToolCalling.NAMED
        calling.function_name = choice.function.name
    else:
        calling.mode = _MODES[choice or "auto"]
    if req.parallel_tool_calls is not None:
        calling.parallel = req.parallel_tool_calls
    if calling.mode in (common_pb2.ToolCalling.REQUIRED, common_pb2.ToolCalling.NAMED) and _has_constraint(msg):
        raise invalid_request(
            "tool_choice 'required' or a named function constrains the output itself; "
            "it cannot be combined with a structured-output constraint",
            "tool_choice",
        )


def _has_constraint(msg: inference_pb2.GenerateRequest) -> bool:
    return msg.sampling_params.WhichOneof("constraint") is not None
