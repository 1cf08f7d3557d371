"""The one thing the gRPC router reads of a call: the model it names, without parsing the message.

ModelInferRequest.model_name, ModelMetadataRequest.name, ModelReadyRequest.name and
ModelConfigRequest.name are all field 1, a string: on the wire the tag byte 0x0a (field 1, wire
type 2: length-delimited), a varint length, the UTF-8 bytes. protobuf writes fields in their
number's order, so that is the first thing in the message, and a 600 KB image tensor behind it is
never looked at. A writer may order fields otherwise (the encoding allows any order): then the
fields before it are skipped by their wire type, each in O(1), never decoded.
"""

from __future__ import annotations

VARINT, FIXED64, LENGTH, START_GROUP, END_GROUP, FIXED32 = range(6)


class WireError(ValueError):
    """The bytes are not a protobuf message."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at `at`, and where the next thing starts."""
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise WireError("a varint runs past the message")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def first_string(data: bytes, field: int = 1) -> str:
    """Field `field` (a string) of the message `data`; "" when it is absent (proto3's default)."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, kind = key >> 3, key & 7
        if kind == LENGTH:
            length, at = _varint(data, at)
            end = at + length
            if end > len(data):
                raise WireError("a field runs past the message")
            if number == field:
                return data[at:end].decode("utf-8", "replace")
            at = end
        elif kind == VARINT:
            _, at = _varint(data, at)
        elif kind == FIXED64:
            at += 8
        elif kind == FIXED32:
            at += 4
        else:  # groups: proto2 only, never in these messages
            raise WireError(f"wire type {kind} is not expected here")
    if at > len(data):
        raise WireError("a field runs past the message")
    return ""
