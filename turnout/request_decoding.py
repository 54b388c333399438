"""Requests that do not parse are the caller's error: INVALID_ARGUMENT naming the field, not UNKNOWN.

Protobuf refuses a `string` field that is not valid UTF-8 (a lone surrogate sent
by a client in another language, random bytes) with a DecodeError that names no
field, and grpc's server turns an exception in the deserializer into UNKNOWN.
`lenient` wraps a method's deserializer so a request that does not parse
becomes an `UndecodableRequest` instead; `StatusInterceptor` answers it with
INVALID_ARGUMENT before the handler runs. To name the field, the raw bytes are
walked once more (wire format + the message's descriptor), only on that error path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

# Nesting the walk follows at most (protobuf's own parser stops at 100 too).
_MAX_DEPTH = 100


@dataclass(frozen=True)
class UndecodableRequest:
    """Stands in for a request that did not parse; `message` says why, for the caller."""

    message: str


def lenient(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """`deserialize`, returning an UndecodableRequest where it raises a DecodeError."""
    # The generated code passes `Message.FromString`: its class has the descriptor.
    descriptor: Descriptor | None = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)

    def deserializer(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as exc:
            return UndecodableRequest(_describe(descriptor, data, exc))

    return deserializer


def _describe(descriptor: Descriptor | None, data: bytes, exc: DecodeError) -> str:
    if descriptor is None:
        return f"the request does not parse: {exc}"
    field = invalid_utf8_field(descriptor, data)
    if field is not None:
        return f"'{field}' is not valid UTF-8 text (string fields must be UTF-8, without surrogates)"
    return f"the request is not a valid {descriptor.full_name}: {exc}"


def invalid_utf8_field(descriptor: Descriptor, data: bytes, prefix: str = "", depth: int = 0) -> str | None:
    """The path (`chat.messages[0].content`) of the first string field in `data` that is not
    valid UTF-8; None if there is none, or the bytes are not a well-formed message."""
    if depth > _MAX_DEPTH:
        return None
    seen: Counter[int] = Counter()
    pos = 0
    try:
        while pos < len(data):
            key, pos = _varint(data, pos)
            number, wire_type = key >> 3, key & 7
            if wire_type == 0:
                _, pos = _varint(data, pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            elif wire_type == 2:
                length, pos = _varint(data, pos)
                value, pos = data[pos : pos + length], pos + length
                field = descriptor.fields_by_number.get(number)
                if field is None:
                    continue
                name = prefix + field.name
                if _is_repeated(field):
                    name += f"[{seen[number]}]"
                    seen[number] += 1
                if field.type == FieldDescriptor.TYPE_STRING:
                    try:
                        value.decode("utf-8")
                    except UnicodeDecodeError:
                        return name
                elif field.type == FieldDescriptor.TYPE_MESSAGE:
                    found = invalid_utf8_field(field.message_type, value, name + ".", depth + 1)
                    if found is not None:
                        return found
            else:
                return None  # groups (proto2 only) or garbage
    except IndexError:
        return None
    return None


def _is_repeated(field: FieldDescriptor) -> bool:
    # `is_repeated` is the newer protobuf spelling; `label` the older one.
    repeated = getattr(field, "is_repeated", None)
    if repeated is not None:
        return bool(repeated)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")
