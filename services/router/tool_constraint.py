"""Tool calling on the way in: checking a request's tool_calling against its tools, and the JSON schema
the engine is constrained to for tool_choice "required" and a named function.

    NAMED     the output is the named tool's arguments object: its `parameters` schema
              (`{"type": "object"}` when it has none)
    REQUIRED  the output is a non-empty array of calls (vLLM's form), one item per call:
              {"type": "array", "minItems": 1, ["maxItems": 1 when parallel is false,]
               "items": {"anyOf": [{"type": "object",
                                    "properties": {"name": {"const": NAME}, "parameters": SCHEMA},
                                    "required": ["name", "parameters"]}, ...one per tool]}}

The tokenizer reads these forms back into tool calls (tool_parsers/constrained.py).
The gateway checks the same things; the router's gRPC front door must be safe on its own.
"""

from __future__ import annotations

import json
from typing import Any

from turnout.errors import InvalidArgument
from turnout.struct_values import struct_to_dict
from turnout.v1 import common_pb2, inference_pb2

Mode = common_pb2.ToolCalling.Mode
_CONSTRAINED = (Mode.REQUIRED, Mode.NAMED)


def tool_schemas(request: inference_pb2.GenerateRequest) -> dict[str, dict[str, Any]]:
    """Each tool's parameters schema by function name, checking the tools' shape."""
    schemas: dict[str, dict[str, Any]] = {}
    if request.WhichOneof("input") != "chat":
        return schemas
    for i, tool in enumerate(request.chat.options.tools):
        entry = struct_to_dict(tool)
        function = entry.get("function")
        if entry.get("type", "function") != "function" or not isinstance(function, dict):
            raise InvalidArgument(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"tools[{i}].function.name must be a non-empty string")
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise InvalidArgument(f"tools[{i}].function.parameters must be a JSON schema object")
        schemas[name] = parameters
    return schemas


def constrain_for_tools(
    request: inference_pb2.GenerateRequest, params: common_pb2.SamplingParams
) -> common_pb2.SamplingParams:
    """`params`, or for REQUIRED / NAMED a copy with the calls' JSON schema as its constraint.

    InvalidArgument for tool_calling without tools, an unknown named tool, or a tool
    constraint combined with another structured-output constraint.
    """
    calling = request.tool_calling
    if calling.mode == Mode.MODE_UNSPECIFIED:
        return params
    schemas = tool_schemas(request)
    mode_name = Mode.Name(calling.mode)
    if not schemas:
        raise InvalidArgument(f"tool_calling mode {mode_name} needs tools (chat.options.tools)")
    if calling.mode not in _CONSTRAINED:
        return params
    other = params.WhichOneof("constraint")
    if other is not None:
        raise InvalidArgument(
            f"tool_calling mode {mode_name} constrains the output to tool calls; it cannot be combined with {other}"
        )
    if calling.mode == Mode.NAMED:
        if calling.function_name not in schemas:
            raise InvalidArgument(f"Tool '{calling.function_name}' not found in tools")
        schema: dict[str, Any] = schemas[calling.function_name]
    else:
        schema = _required_schema(schemas, parallel=calling.parallel if calling.HasField("parallel") else True)
    out = common_pb2.SamplingParams()
    out.CopyFrom(params)
    out.json_schema = json.dumps(schema)
    return out


# Where a schema keeps the definitions its local `$ref`s ("#/$defs/X", "#/definitions/X") point to.
_DEFINITIONS = ("$defs", "definitions")


def _required_schema(schemas: dict[str, dict[str, Any]], *, parallel: bool) -> dict[str, Any]:
    """The array-of-calls schema. A tool's local definitions move to its root: nested in `items`, the
    tool's `#/$defs/...` references would resolve against the root, which has none of them."""
    hoisted: dict[str, dict[str, Any]] = {}
    calls = []
    for name, parameters in schemas.items():
        parameters = dict(parameters)
        for key in _DEFINITIONS:
            for def_name, definition in (parameters.pop(key, None) or {}).items():
                known = hoisted.setdefault(key, {})
                if known.setdefault(def_name, definition) != definition:
                    raise InvalidArgument(
                        f"tools define '{key}/{def_name}' differently; tool_choice 'required' needs one definition"
                    )
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, "parameters": parameters},
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}, **hoisted}
    if not parallel:
        schema["maxItems"] = 1
    return schema
