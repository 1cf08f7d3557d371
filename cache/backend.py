"""What a store of cached replies is: the protocol LMDB and Redis implement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from onnxpool.cache.key import CacheKey


@dataclass(frozen=True, slots=True)
class Stored:
    """What one put did besides storing: entries evicted for room, expired entries purged,
    and the store's accounted bytes afterwards (None where the backend does not count)."""

    evicted: int = 0
    expired: int = 0
    bytes_used: int | None = None


class Store(Protocol):
    """A byte store. get/put raise on backend failure; ResponseCache turns that into a miss/drop."""

    name: str
    remote: bool

    def get(self, key: CacheKey) -> bytes | None: ...

    def put(self, key: CacheKey, value: bytes, ttl_seconds: float) -> Stored | None:
        """Store; what it took (see Stored), or None if the value can never fit."""
        ...

    def bytes_used(self) -> int | None: ...

    def close(self) -> None: ...
