"""The cache's rules: when to read, store, skip, evict; a failing backend is a miss, never an error.

`ResponseCache` is what the HTTP layer calls; `prepare` (master, before fork) and
`open_cache` (each worker, after fork) are its lifecycle (see the package doc).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import lmdb

from onnxpool.cache.backend import Store, Stored
from onnxpool.cache.codec import CachedReply, CorruptEntry, decode_reply, encode_reply
from onnxpool.cache.control import DEFAULT_CONTROL, CacheControl
from onnxpool.cache.key import CacheKey, ParamValue
from onnxpool.cache.lmdb_store import LocalStore
from onnxpool.cache.redis_store import RedisStore
from onnxpool.config.settings import CacheSettings

log = logging.getLogger("onnxpool.cache")

ERROR_LOG_INTERVAL_SECONDS: Final = 60.0
"""Backend errors are logged at most once per interval (with the number suppressed), per process."""

EventHook = Callable[[str, str, float], None]
"""on_event(name, backend, value). Names: "hit", "miss", "store" (value 1), "evict"
(value = entries evicted for room), "expire" (entries purged after their TTL),
"skip" (not stored: too large or not 200), "error" (backend failure, value 1),
"lookup" (value = seconds spent in lookup, hit or miss)."""


@dataclass
class CacheStats:
    """Per-process counters (each worker has its own; Prometheus sums them)."""

    hits: int = 0
    misses: int = 0
    stores: int = 0
    evictions: int = 0
    expirations: int = 0
    skipped: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    lookups: int = 0
    lookup_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, backend: str, value: float = 1.0) -> None:
        with self._lock:
            if name == "hit":
                self.hits += 1
            elif name == "miss":
                self.misses += 1
            elif name == "store":
                self.stores += 1
            elif name == "evict":
                self.evictions += int(value)
            elif name == "expire":
                self.expirations += int(value)
            elif name == "skip":
                self.skipped += 1
            elif name == "error":
                self.errors[backend] = self.errors.get(backend, 0) + 1
            elif name == "lookup":
                self.lookups += 1
                self.lookup_seconds += value

    def error_count(self, backend: str) -> int:
        with self._lock:
            return self.errors.get(backend, 0)


class _RateLimitedLog:
    """Log a backend problem at most once per interval, saying how many were suppressed."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last = float("-inf")
        self._suppressed = 0
        self._lock = threading.Lock()

    def warning(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < self.interval:
                self._suppressed += 1
                return
            self._last, suppressed, self._suppressed = now, self._suppressed, 0
        if suppressed:
            log.warning(msg + " (%d similar suppressed)", *args, suppressed)
        else:
            log.warning(msg, *args)


class ResponseCache:
    """What the HTTP layer calls. Never raises for backend trouble and never waits past
    the backend's timeout: a failing get is a miss, a failing put is dropped, both counted
    ("error" by backend) and logged at most once per interval. For a remote backend a
    circuit breaker skips the backend for `redis_cooldown_seconds` after an error."""

    def __init__(
        self,
        store: Store,
        settings: CacheSettings,
        on_event: EventHook | None = None,
        error_log_interval: float = ERROR_LOG_INTERVAL_SECONDS,
    ) -> None:
        self.store = store
        self.settings = settings
        self.stats = CacheStats()
        self._hook = on_event
        self._log = _RateLimitedLog(error_log_interval)
        self._cooldown = settings.redis_cooldown_seconds if store.remote else 0.0
        self._open_until = 0.0  # breaker: monotonic time before which the store is skipped
        self._broken = False

    @property
    def backend(self) -> str:
        return self.store.name

    def _event(self, name: str, value: float = 1.0) -> None:
        self.stats.add(name, self.store.name, value)
        if self._hook is not None:
            try:
                self._hook(name, self.store.name, value)
            except Exception:  # a metrics bug must not break requests
                log.exception("cache on_event hook failed")

    def _available(self) -> bool:
        return not self._broken or time.monotonic() >= self._open_until

    def _failed(self, op: str, exc: BaseException) -> None:
        self._event("error")
        if self._cooldown > 0:
            self._broken = True
            self._open_until = time.monotonic() + self._cooldown
        self._log.warning(
            "response cache (%s) %s failed: %s: %s; serving without the cache%s",
            self.store.name,
            op,
            type(exc).__name__,
            exc,
            f", retrying in {self._cooldown:g} s" if self._cooldown > 0 else "",
        )

    def _succeeded(self) -> None:
        if self._broken:
            self._broken = False
            log.warning("response cache (%s) is back", self.store.name)

    def lookup(self, key: CacheKey, control: CacheControl = DEFAULT_CONTROL) -> CachedReply | None:
        """A hit's reply, or None (miss, no-cache/no-store, backend down or corrupt entry).

        Requests that may not read (no-cache/no-store) are not counted as lookups."""
        if not control.read:
            return None
        start = time.perf_counter()
        reply: CachedReply | None = None
        if self._available():
            try:
                data = self.store.get(key)
                self._succeeded()
                if data is not None:
                    reply = decode_reply(data)
            except CorruptEntry as exc:
                self._event("error")
                self._log.warning("response cache (%s): corrupt entry %s: %s", self.store.name, key.hex(), exc)
            except Exception as exc:
                self._failed("get", exc)
        self._event("lookup", time.perf_counter() - start)
        self._event("hit" if reply is not None else "miss")
        return reply

    def store_reply(
        self, key: CacheKey, status: int, reply: CachedReply, control: CacheControl = DEFAULT_CONTROL
    ) -> Stored | None:
        """Store a computed reply; what the store did, or None when not stored. Only status 200;
        not when the request said no-store; not when the encoded entry exceeds
        max_entry_bytes; dropped if the backend fails."""
        if not control.write:
            return None
        if status != 200:
            self._event("skip")
            return None
        try:
            data = encode_reply(reply)
        except ValueError as exc:  # e.g. a non-ASCII header: serve the reply, just don't cache it
            self._event("skip")
            self._log.warning("response cache: reply not stored: %s", exc)
            return None
        if len(data) > self.settings.max_entry_bytes:
            self._event("skip")
            return None
        if not self._available():
            return None
        try:
            done = self.store.put(key, data, self.settings.ttl_seconds)
            self._succeeded()
        except Exception as exc:
            self._failed("put", exc)
            return None
        if done is None:
            self._event("skip")
            return None
        if done.evicted:
            self._event("evict", done.evicted)
        if done.expired:
            self._event("expire", done.expired)
        self._event("store")
        return done

    def bytes_used(self) -> int | None:
        """Bytes accounted in the local store (shared by all workers: export as a gauge from
        any one process); None for Redis or when the store cannot answer."""
        try:
            return self.store.bytes_used()
        except Exception as exc:
            self._failed("bytes_used", exc)
            return None

    def close(self) -> None:
        self.store.close()


class CacheSetupError(RuntimeError):
    """The local store's files cannot be made (one line for an operator)."""


def prepare(settings: CacheSettings, folder: str | os.PathLike[str]) -> None:
    """Master, before fork: create the local store's folder and schema unless they exist.

    Kept across HUP (the run folder is new each start): entries of an older model stay but
    are never hit (the model digest is in every key) and age out. Nothing to do for Redis
    or when disabled. Opens no connection that survives."""
    if settings.enabled and not settings.url and not LocalStore.exists(folder):
        try:
            LocalStore.create(folder, settings.max_bytes)
        except (OSError, lmdb.Error) as exc:
            raise CacheSetupError(f"cannot create the local cache in {folder}: {exc}") from None


def open_cache(
    settings: CacheSettings, folder: str | os.PathLike[str], *, on_event: EventHook | None = None
) -> ResponseCache | None:
    """Worker, after fork: the worker's cache, or None when disabled."""
    if not settings.enabled:
        return None
    store: Store = RedisStore(settings) if settings.url else LocalStore(folder, settings)
    return ResponseCache(store, settings, on_event)


@dataclass(frozen=True)
class Lookup:
    """One request's look into the cache: what it asked, its key, the stored reply if any."""

    endpoint: str
    params: dict[str, ParamValue]
    control: CacheControl
    key: CacheKey | None
    """None for no-store: nothing hashed, nothing looked up or stored."""
    reply: CachedReply | None
    """The hit's reply; None on a miss."""
    seconds: float
    """Time to hash the key and look it up (Server-Timing `cache;dur`)."""
