"""Struct values come back with their integers (a JSON schema's maxLength, a token id)."""

from __future__ import annotations

from google.protobuf.struct_pb2 import Struct

from turnout.struct_values import struct_to_dict


def test_whole_numbers_are_ints_again() -> None:
    struct = Struct()
    struct.update({"maxLength": 30, "minimum": -2, "ratio": 0.5, "nested": [{"id": 5}, 2.0, "x", True, None]})
    plain = struct_to_dict(struct)
    assert plain == {"maxLength": 30, "minimum": -2, "ratio": 0.5, "nested": [{"id": 5}, 2, "x", True, None]}
    assert type(plain["maxLength"]) is int and type(plain["nested"][0]["id"]) is int
    assert type(plain["ratio"]) is float and plain["nested"][3] is True
