"""JSON via orjson: fast, UTF-8 out with non-ASCII kept, numpy arrays natively."""

from __future__ import annotations

from typing import Any

import orjson

from onnxpool.tasks.errors import BadRequest

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


def check_depth(value: Any, limit: int, what: str = "request body") -> None:
    """400 if containers nest deeper than `limit` (the top-level object is depth 1).

    Iterative, so depth costs no recursion. A list whose first item is not a
    container is taken as a leaf (tensor data): the walk stays O(structure),
    not O(values), for a 150k-element data list. Nesting hidden behind a
    leading number is bounded by orjson's own limit (1024) and rejected by
    numpy when such a list is read as a tensor (ragged or over 64 dimensions).
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise BadRequest(f"{what} nests deeper than {limit} levels")
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list) and node and isinstance(node[0], list | dict):
            children = node
        else:
            continue
        stack.extend((child, depth + 1) for child in children if isinstance(child, list | dict))
