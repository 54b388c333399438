"""tool_choice "required" over tools whose parameters use local `$defs` / `definitions` (vLLM answers
200; the nested references used to point at a root without them: "Cannot find field $defs")."""

from __future__ import annotations

import json
from typing import Any

import pytest
import xgrammar

from services.router.tool_constraint import _required_schema
from turnout.errors import InvalidArgument


def _tool(key: str) -> dict[str, Any]:
    address = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    return {
        "type": "object",
        key: {"Address": address},
        "properties": {"name": {"type": "string"}, "address": {"$ref": f"#/{key}/Address"}},
        "required": ["name", "address"],
    }


@pytest.mark.parametrize("key", ["$defs", "definitions"])
def test_local_definitions_compile_in_the_required_schema(key: str) -> None:
    schema = _required_schema({"add_person": _tool(key), "add_other": _tool(key)}, parallel=True)
    assert set(schema[key]) == {"Address"}
    compiled = xgrammar.Grammar.from_json_schema(json.dumps(schema))
    assert compiled is not None


def test_two_tools_defining_one_name_differently_is_refused() -> None:
    other = _tool("$defs")
    other["$defs"]["Address"] = {"type": "string"}
    with pytest.raises(InvalidArgument, match=r"\$defs/Address"):
        _required_schema({"a": _tool("$defs"), "b": other}, parallel=True)
