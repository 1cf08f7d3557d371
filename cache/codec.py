"""A stored reply and its framing: what is written to LMDB or Redis, checked on the way back."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Final


class CorruptEntry(ValueError):
    """A stored value that is not a well-formed encoded reply (treated as a miss)."""


@dataclass(frozen=True, slots=True)
class CachedReply:
    """A status-200 reply as replayed on a hit. Headers: only those that must be
    replayed verbatim (e.g. Inference-Header-Content-Length); never X-Request-ID,
    Date, Server-Timing or anything per request."""

    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


_MAGIC: Final = b"ORC1"
_HEAD: Final = struct.Struct(">4sHBI")  # magic, content-type length, header count, body length
_HDR: Final = struct.Struct(">BH")  # name length, value length
_TOKEN_RE: Final = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE_RE: Final = re.compile(rb"[\x20-\x7e\t]*")  # visible ASCII: no CR/LF, so no header injection


def _ascii(text: str, pattern: re.Pattern[bytes], what: str) -> bytes:
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError(f"cached reply: {what} is not ASCII") from None
    if pattern.fullmatch(raw) is None:
        raise ValueError(f"cached reply: {what} has characters not allowed in a header")
    return raw


def encode_reply(reply: CachedReply) -> bytes:
    """Compact framing: fixed header, content type, headers, body. Raises ValueError on bad headers."""
    ctype = _ascii(reply.content_type, _VALUE_RE, "content type")
    if len(ctype) > 0xFFFF or len(reply.headers) > 0xFF or len(reply.body) > 0xFFFFFFFF:
        raise ValueError("cached reply: too large to frame")
    chunks = [_HEAD.pack(_MAGIC, len(ctype), len(reply.headers), len(reply.body)), ctype]
    for name, value in reply.headers:
        n = _ascii(name, _TOKEN_RE, f"header name {name!r}")
        v = _ascii(value, _VALUE_RE, f"header {name!r}")
        if len(n) > 0xFF or len(v) > 0xFFFF:
            raise ValueError(f"cached reply: header {name!r} too long")
        chunks += [_HDR.pack(len(n), len(v)), n, v]
    chunks.append(reply.body)
    return b"".join(chunks)


def decode_reply(data: bytes) -> CachedReply:
    """Inverse of `encode_reply`; any inconsistency raises CorruptEntry (never a partial reply)."""
    try:
        magic, ctype_len, n_headers, body_len = _HEAD.unpack_from(data, 0)
        if magic != _MAGIC:
            raise CorruptEntry("bad magic")
        pos = _HEAD.size
        ctype = data[pos : pos + ctype_len]
        pos += ctype_len
        headers: list[tuple[str, str]] = []
        for _ in range(n_headers):
            n_len, v_len = _HDR.unpack_from(data, pos)
            pos += _HDR.size
            name, value = data[pos : pos + n_len], data[pos + n_len : pos + n_len + v_len]
            pos += n_len + v_len
            if _TOKEN_RE.fullmatch(name) is None or _VALUE_RE.fullmatch(value) is None:
                raise CorruptEntry("bad header")
            headers.append((name.decode("ascii"), value.decode("ascii")))
        if len(ctype) != ctype_len or _VALUE_RE.fullmatch(ctype) is None:
            raise CorruptEntry("bad content type")
        if len(data) - pos != body_len:
            raise CorruptEntry(f"body is {len(data) - pos} bytes, header says {body_len}")
        return CachedReply(body=bytes(data[pos:]), content_type=ctype.decode("ascii"), headers=tuple(headers))
    except struct.error as exc:
        raise CorruptEntry(f"truncated: {exc}") from None
