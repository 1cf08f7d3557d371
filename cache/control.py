"""The request's Cache-Control (and Pragma): may a reply be read from the cache, stored in it?"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class CacheControl:
    """What a request allows: read (serve a hit) and write (store the computed reply)."""

    read: bool = True
    write: bool = True


DEFAULT_CONTROL: Final = CacheControl()


def parse_cache_control(header: str | Iterable[str] | None, pragma: str | None = None) -> CacheControl:
    """Request `Cache-Control`: `no-cache` = don't read, compute, then write (refresh);
    `no-store` = neither read nor write. Directive names are case-insensitive, arguments
    ignored, other directives (max-age, ...) ignored. Several header lines may be passed
    as an iterable. `Pragma: no-cache` (HTTP/1.0) counts as `no-cache`."""
    if header is None:
        lines: Iterable[str] = ()
    elif isinstance(header, str):
        lines = (header,)
    else:
        lines = header
    names = {part.split("=", 1)[0].strip().lower() for line in lines for part in line.split(",")}
    if pragma is not None and "no-cache" in {p.split("=", 1)[0].strip().lower() for p in pragma.split(",")}:
        names.add("no-cache")
    if "no-store" in names:
        return CacheControl(read=False, write=False)
    if "no-cache" in names:
        return CacheControl(read=False, write=True)
    return DEFAULT_CONTROL
