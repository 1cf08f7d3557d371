"""JSON via orjson: fast, UTF-8 out with non-ASCII kept, numpy arrays natively."""

from __future__ import annotations

from typing import Any

import orjson

from server.errors import BadRequest

_DUMP_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def dumps(value: Any) -> bytes:
    """Serialise to UTF-8 JSON bytes (non-ASCII characters are kept as is)."""
    return orjson.dumps(value, option=_DUMP_OPTIONS)


def loads(data: bytes | bytearray | memoryview | str, what: str = "request body") -> Any:
    """Parse JSON, turning any parse error into a 400 that says where it failed."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"{what} is not valid JSON: {exc}") from None
