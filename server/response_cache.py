"""Response cache: a reply computed once is served again, by any worker of a host or by any host.

Self-contained on purpose: it imports nothing from onnxpool. The HTTP layer
(`onnxpool.server`) builds a key per request, asks `ResponseCache.lookup`, and on
a miss computes the reply and hands it to `ResponseCache.store`. Everything here
is off the request path's failure modes: a broken or slow cache is a miss, never
an error or a stall past a short timeout.

Lifecycle under gunicorn (pre-fork, `preload_app = True`)::

    # master, before forking (e.g. in `on_starting` / app factory):
    prepare(settings, run_dir / "cache")        # creates folder + SQLite schema, opens nothing
    # each worker, AFTER fork (gunicorn `post_fork`, or lazily on the first request):
    cache = open_cache(settings, run_dir / "cache", on_event=metrics_hook)

Why open after fork: a SQLite connection (its file descriptors, its POSIX
advisory locks and the WAL-index mmap) must not cross fork(); a child using or
even closing its parent's connection can corrupt the lock state of both
(https://www.sqlite.org/howtocorrupt.html, section 2.6). A Redis client's
sockets would likewise be shared by two processes. So the master only creates
the files; every worker opens its own connections. `LocalStore` checks the pid
on every call and refuses a connection inherited across fork.

What is in the key (see `cache_key`): the model file's digest, a fingerprint of
the pre/postprocessing settings (include the onnxpool version: a release that
changes the reply format must not serve an older format), the endpoint name and
its *effective* parameters (after defaults are applied), and the request's
payload bytes (for multipart: each image's bytes in order, never the boundary).
What is NOT in the key: echo-only fields, i.e. the v2 request `id` and the
`X-Request-ID` header. The caller puts those into the reply fresh on a hit (a v2
JSON reply's `id`, the `X-Request-ID` response header); so a reply body that
contains an echoed id must be stored *without* it and completed per request, or
the endpoint must not be cached. For v2 requests use `v2_request_payload` to
drop the `id` from the request before keying.

Stored values are whole replies with status 200 only (errors are never stored):
body bytes, content type and the few headers that must be replayed (e.g.
`Inference-Header-Content-Length`). They are framed by `encode_reply` (fixed
11-byte header, lengths, ASCII-checked header strings, then the body) and
`decode_reply` checks every length, so nothing from SQLite or Redis is ever
unpickled or trusted to be well-formed.

Backends:

* local (`url = ""`): SQLite in WAL mode, in a folder on tmpfs, shared by all the
  workers of one host. One table, one index; readers never block on writers
  (WAL); a put is one `BEGIN IMMEDIATE` transaction that also expires and evicts
  (least recently stored first), so a reader sees a whole value or none, and the
  byte total stays within `max_bytes`. Chosen over `diskcache` and shared
  memory by measurement: see docs/RESPONSE_CACHE.md.
* Redis (`url = "redis://host:port/db"`): same keys under a prefix, TTL via
  `SET ... PX`, short connect/read timeouts, no client retries, and a circuit
  breaker: after an error every call is an instant miss/drop for
  `redis_cooldown_seconds`, then one call probes again; it recovers by itself.

Counters: `CacheStats` (per process) plus an optional `on_event(name, backend,
value)` hook for Prometheus; this module never imports prometheus_client.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NewType, Protocol, TypeAlias

if TYPE_CHECKING:  # the redis client is only needed (and imported) when a redis:// url is configured
    import redis

__all__ = [
    "CacheControl",
    "CacheKey",
    "CacheSettings",
    "CacheStats",
    "CachedReply",
    "CorruptEntry",
    "EventHook",
    "LocalStore",
    "RedisStore",
    "ResponseCache",
    "cache_key",
    "decode_reply",
    "encode_reply",
    "open_cache",
    "parse_cache_control",
    "prepare",
    "v2_request_payload",
]

log = logging.getLogger("onnxpool.cache")

MiB: Final = 1 << 20


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """The `[cache]` section (the project's pydantic settings are mapped onto this).

    url: "" = local SQLite store shared by the workers of this host;
         "redis://host:port/db" (or rediss://, unix://) = Redis shared by several hosts.
    max_bytes: local store's total (keys + values + a per-row estimate); Redis is
         bounded by its own `maxmemory` + `maxmemory-policy allkeys-lru`.
    max_entry_bytes: an encoded reply larger than this is not stored (either backend).
    ttl_seconds: lifetime of an entry (local and Redis).
    redis_*_timeout_seconds: socket connect / read-write timeouts; the worst a
         request waits on a slow or dead Redis.
    redis_cooldown_seconds: after a Redis error, calls skip Redis this long, then
         one call probes it again.
    local_busy_timeout_seconds: how long a local put waits for SQLite's write lock
         before the entry is dropped (reads never wait in WAL mode).
    error_log_interval_seconds: backend errors are logged at most once per interval
         (with the number suppressed), per process.
    """

    enabled: bool = True
    url: str = ""
    max_bytes: int = 64 * MiB
    max_entry_bytes: int = 1 * MiB
    ttl_seconds: float = 3600.0
    redis_connect_timeout_seconds: float = 0.05
    redis_timeout_seconds: float = 0.1
    redis_cooldown_seconds: float = 5.0
    redis_key_prefix: str = "onnxpool:rc1:"
    local_busy_timeout_seconds: float = 0.05
    error_log_interval_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.max_bytes <= 0 or self.max_entry_bytes <= 0:
            raise ValueError("cache: max_bytes and max_entry_bytes must be > 0")
        if self.ttl_seconds <= 0:
            raise ValueError("cache: ttl_seconds must be > 0")
        for name in ("redis_connect_timeout_seconds", "redis_timeout_seconds", "local_busy_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"cache: {name} must be > 0")
        if self.url and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"cache: url must be empty (local) or redis://..., got {self.url!r}")

    @property
    def backend_name(self) -> str:
        return "redis" if self.url else "local"


# --------------------------------------------------------------------------- key

CacheKey = NewType("CacheKey", bytes)
"""32-byte SHA-256 digest; `.hex()` for logs."""

ParamValue: TypeAlias = "bool | int | float | str | Sequence[ParamValue] | None"
BytesLike: TypeAlias = bytes | bytearray | memoryview

# Domain + key-format version, hashed first. SHA-256, not BLAKE2b: with the SHA extensions
# of current x86 and ARM CPUs it hashes a 35 KB photo in ~25 us instead of ~45 us, and the
# key is computed on every request (docs/RESPONSE_CACHE.md).
_KEY_DOMAIN: Final = b"onnxpool-rc-v2"


def _check_param(value: object, where: str) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"cache key: parameter {where} is not finite")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_param(item, f"{where}[{i}]")
        return
    raise TypeError(f"cache key: parameter {where} has unsupported type {type(value).__name__}")


def canonical_params(params: Mapping[str, ParamValue]) -> bytes:
    """Sorted, compact JSON of the endpoint parameters (lists keep their order).

    Pass *effective* values (defaults applied, types normalised): `top_k=5` and a
    missing `top_k` that defaults to 5 must be the same request. 1, 1.0 and True
    serialise differently on purpose.
    """
    for name, value in params.items():
        if not isinstance(name, str):
            raise TypeError("cache key: parameter names must be str")
        _check_param(value, name)
    return json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def cache_key(
    *,
    model_digest: str,
    settings_fingerprint: str,
    endpoint: str,
    params: Mapping[str, ParamValue],
    payload: BytesLike | Sequence[BytesLike],
) -> CacheKey:
    """The key of a reply: SHA-256 over a domain tag and length-prefixed fields.

    payload: the request body bytes, or for multipart the parts' bytes in order
    (a list of one part and the bare bytes give different keys only if the caller
    mixes both forms for one endpoint: pick one). Echo-only fields (v2 `id`,
    X-Request-ID) are deliberately not inputs: see the module docstring.
    """
    h = hashlib.sha256(_KEY_DOMAIN)

    def put(data: BytesLike) -> None:
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)

    put(model_digest.encode())
    put(settings_fingerprint.encode())
    put(endpoint.encode())
    put(canonical_params(params))
    parts: Sequence[BytesLike] = [payload] if isinstance(payload, (bytes, bytearray, memoryview)) else payload
    h.update(len(parts).to_bytes(8, "big"))
    for part in parts:
        put(part)
    return CacheKey(h.digest())


def v2_request_payload(request: Mapping[str, Any]) -> bytes:
    """A KServe-v2 inference request (its JSON header, decoded) without its echo-only `id`.

    Sorted, compact JSON; for the binary-data extension pass
    `payload=[v2_request_payload(header), binary_tail]` to `cache_key`.
    """
    stripped = {k: v for k, v in request.items() if k != "id"}
    try:
        import orjson  # fast for large JSON tensors; a dependency of onnxpool anyway

        return orjson.dumps(stripped, option=orjson.OPT_SORT_KEYS)
    except ImportError:  # pragma: no cover - orjson is installed with onnxpool
        return json.dumps(stripped, sort_keys=True, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- stored value


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


# --------------------------------------------------------------------------- Cache-Control


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


# --------------------------------------------------------------------------- counters

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


# --------------------------------------------------------------------------- backends


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


_DB_NAME: Final = "responses.sqlite3"
_SCHEMA_VERSION: Final = 1
_ROW_OVERHEAD: Final = 64  # per-row bookkeeping counted against max_bytes (row header, index entry)
_PURGE_BATCH: Final = 64
_EVICT_BATCH: Final = 128

_SCHEMA: Final = f"""
CREATE TABLE entries (
    key     BLOB PRIMARY KEY,
    value   BLOB NOT NULL,
    size    INTEGER NOT NULL,   -- accounted bytes: len(key) + len(value) + {_ROW_OVERHEAD}
    expires REAL NOT NULL       -- unix time; with one TTL also the order in which entries were stored
) WITHOUT ROWID;
CREATE INDEX entries_expires ON entries (expires);
CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO meta VALUES ('bytes', 0), ('entries', 0);
PRAGMA user_version = {_SCHEMA_VERSION};
"""


class LocalStore:
    """SQLite (WAL) in a folder on tmpfs, shared by the worker processes of one host.

    `LocalStore.create(folder)` runs in the master before fork (fresh files every
    start); `LocalStore(folder, settings)` in each worker after fork. Connections
    are per thread (gthread workers) and opened lazily; one opened before a fork
    is never used by the child.
    """

    name = "local"
    remote = False

    @staticmethod
    def exists(folder: str | os.PathLike[str]) -> bool:
        """Whether `create` already made the database in `folder` (a master keeps it across HUP)."""
        return (Path(folder) / _DB_NAME).is_file()

    @staticmethod
    def create(folder: str | os.PathLike[str]) -> Path:
        """Create the folder (0700) and a fresh, empty database; leaves no connection open."""
        path = Path(folder)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        db = path / _DB_NAME
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(str(db) + suffix).unlink(missing_ok=True)
        con = sqlite3.connect(db, isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode=WAL")  # persistent: every later connection is WAL
            con.executescript(_SCHEMA)
        finally:
            con.close()
        return db

    def __init__(self, folder: str | os.PathLike[str], settings: CacheSettings) -> None:
        self.path = Path(folder) / _DB_NAME
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path}: the master must call prepare() before forking workers")
        self.max_bytes = settings.max_bytes
        self.busy_timeout = settings.local_busy_timeout_seconds
        self._pid = os.getpid()
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._con()  # fail now (in post_fork) rather than on the first request

    def _con(self) -> sqlite3.Connection:
        if os.getpid() != self._pid:
            raise RuntimeError("LocalStore was opened before fork: open it in each worker after fork")
        con: sqlite3.Connection | None = getattr(self._local, "con", None)
        if con is None:
            uri = f"file:{self.path}?mode=rw"  # never create a stray empty database
            con = sqlite3.connect(
                uri, uri=True, isolation_level=None, timeout=self.busy_timeout, check_same_thread=False
            )
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version != _SCHEMA_VERSION:
                con.close()
                raise RuntimeError(f"{self.path}: schema version {version}, expected {_SCHEMA_VERSION}")
            con.execute("PRAGMA synchronous=OFF")  # tmpfs: durability across power loss is meaningless
            con.execute("PRAGMA journal_size_limit=8388608")
            self._local.con = con
            with self._lock:
                self._all.append(con)
        return con

    def get(self, key: CacheKey) -> bytes | None:
        row = (
            self._con()
            .execute("SELECT value FROM entries WHERE key = ? AND expires > ?", (key, time.time()))
            .fetchone()
        )
        return None if row is None else bytes(row[0])

    def put(self, key: CacheKey, value: bytes, ttl_seconds: float) -> Stored | None:
        size = len(key) + len(value) + _ROW_OVERHEAD
        if size > self.max_bytes:
            return None
        con = self._con()
        now = time.time()
        con.execute("BEGIN IMMEDIATE")  # the write lock, waiting at most busy_timeout
        try:
            expired = self._delete(
                con,
                con.execute(
                    "SELECT key, size FROM entries WHERE expires <= ? ORDER BY expires LIMIT ?", (now, _PURGE_BATCH)
                ).fetchall(),
            )
            old = con.execute("SELECT size FROM entries WHERE key = ?", (key,)).fetchone()
            old_size = 0 if old is None else int(old[0])
            total = int(con.execute("SELECT value FROM meta WHERE name = 'bytes'").fetchone()[0])
            need = total - old_size + size - self.max_bytes
            evicted = 0
            while need > 0:
                rows = con.execute(
                    "SELECT key, size FROM entries WHERE key != ? ORDER BY expires LIMIT ?", (key, _EVICT_BATCH)
                ).fetchall()
                if not rows:
                    break
                victims = []
                for row in rows:
                    victims.append(row)
                    need -= int(row[1])
                    if need <= 0:
                        break
                evicted += self._delete(con, victims)
            con.execute(
                "INSERT INTO entries (key, value, size, expires) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET "
                "value = excluded.value, size = excluded.size, expires = excluded.expires",
                (key, value, size, now + ttl_seconds),
            )
            con.execute(
                "UPDATE meta SET value = value + ? WHERE name = 'bytes'",
                (size - old_size,),
            )
            if old is None:
                con.execute("UPDATE meta SET value = value + 1 WHERE name = 'entries'")
            # The total as this transaction leaves it, for the bytes gauge: asked here, inside
            # the write lock, rather than by a query of its own after every miss (one more
            # transaction, re-reading the pages the other workers changed).
            used = int(con.execute("SELECT value FROM meta WHERE name = 'bytes'").fetchone()[0])
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        return Stored(evicted, expired, used)

    @staticmethod
    def _delete(con: sqlite3.Connection, rows: Sequence[tuple[bytes, int]]) -> int:
        if not rows:
            return 0
        con.executemany("DELETE FROM entries WHERE key = ?", [(r[0],) for r in rows])
        con.execute("UPDATE meta SET value = value - ? WHERE name = 'bytes'", (sum(int(r[1]) for r in rows),))
        con.execute("UPDATE meta SET value = value - ? WHERE name = 'entries'", (len(rows),))
        return len(rows)

    def bytes_used(self) -> int | None:
        return int(self._con().execute("SELECT value FROM meta WHERE name = 'bytes'").fetchone()[0])

    def entries(self) -> int:
        return int(self._con().execute("SELECT value FROM meta WHERE name = 'entries'").fetchone()[0])

    def close(self) -> None:
        if os.getpid() != self._pid:  # never close a parent's connection in a child
            return
        with self._lock:
            cons, self._all = self._all, []
        for con in cons:
            con.close()
        self._local = threading.local()


class RedisStore:
    """Redis shared by several hosts: same keys, under `redis_key_prefix`; TTL by SET PX.

    The client does no retries and has short socket timeouts, so a call fails fast;
    ResponseCache's circuit breaker then skips Redis for a cooldown. redis-py's pool
    also resets itself after fork, but open this in the worker anyway.
    """

    name = "redis"
    remote = True

    def __init__(self, settings: CacheSettings) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.prefix = settings.redis_key_prefix.encode()
        self.client: redis.Redis = redis.Redis.from_url(
            settings.url,
            socket_connect_timeout=settings.redis_connect_timeout_seconds,
            socket_timeout=settings.redis_timeout_seconds,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
            decode_responses=False,
        )

    def _k(self, key: CacheKey) -> bytes:
        return self.prefix + key.hex().encode()

    def get(self, key: CacheKey) -> bytes | None:
        value = self.client.get(self._k(key))
        if value is None:
            return None
        if not isinstance(value, bytes):
            raise TypeError(f"redis returned {type(value).__name__}")
        return value

    def put(self, key: CacheKey, value: bytes, ttl_seconds: float) -> Stored | None:
        self.client.set(self._k(key), value, px=max(1, int(ttl_seconds * 1000)))
        return Stored()

    def bytes_used(self) -> int | None:
        return None  # Redis bounds itself (maxmemory); INFO is too slow for a scrape per worker

    def close(self) -> None:
        self.client.close()


# --------------------------------------------------------------------------- facade


class ResponseCache:
    """What the HTTP layer calls. Never raises for backend trouble and never waits past
    the backend's timeout: a failing get is a miss, a failing put is dropped, both counted
    ("error" by backend) and logged at most once per interval. For a remote backend a
    circuit breaker skips the backend for `redis_cooldown_seconds` after an error."""

    def __init__(self, store: Store, settings: CacheSettings, on_event: EventHook | None = None) -> None:
        self.store = store
        self.settings = settings
        self.stats = CacheStats()
        self._hook = on_event
        self._log = _RateLimitedLog(settings.error_log_interval_seconds)
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


def prepare(settings: CacheSettings, folder: str | os.PathLike[str]) -> None:
    """Master, before fork: create the local store's folder and schema (fresh each start).
    Nothing to do for Redis or when disabled. Opens no connection that survives."""
    if settings.enabled and not settings.url:
        LocalStore.create(folder)


def open_cache(
    settings: CacheSettings, folder: str | os.PathLike[str], *, on_event: EventHook | None = None
) -> ResponseCache | None:
    """Worker, after fork: the worker's cache, or None when disabled."""
    if not settings.enabled:
        return None
    store: Store = RedisStore(settings) if settings.url else LocalStore(folder, settings)
    return ResponseCache(store, settings, on_event)
