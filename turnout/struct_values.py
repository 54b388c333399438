"""`google.protobuf.Struct` -> plain JSON values, with integers given back.

A Struct stores every number as a double, so `{"maxLength": 30}` arrives as
`30.0`. JSON schemas (xgrammar refuses a float `maxLength`), chat templates
(which print the tools into the prompt) and processor parameters (a token id)
all need the integer the client sent: a whole number comes back as an int.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct


def struct_to_dict(struct: Struct) -> dict[str, Any]:
    return _restore_ints(MessageToDict(struct))  # type: ignore[no-any-return]


def _restore_ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: _restore_ints(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_restore_ints(item) for item in value]
    return value
