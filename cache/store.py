"""Response cache: a reply computed once is served again, by any worker of a host or by any host.

Self-contained on purpose: it imports nothing from onnxpool. The HTTP layer
(`onnxpool.server`) builds a key per request, asks `ResponseCache.lookup`, and on
a miss computes the reply and hands it to `ResponseCache.store`. Everything here
is off the request path's failure modes: a broken or slow cache is a miss, never
an error or a stall past a short timeout.

Lifecycle under gunicorn (pre-fork, `preload_app = True`)::

    # master, before forking (e.g. in `on_starting` / app factory):
    prepare(settings, run_dir / "cache")        # creates folder + empty LMDB store, opens nothing
    # each worker, AFTER fork (gunicorn `post_fork`, or lazily on the first request):
    cache = open_cache(settings, run_dir / "cache", on_event=metrics_hook)

Why open after fork: an LMDB environment (its memory map, the lock file's
reader slot and file descriptors) must not be used by a process that inherited
it across fork() (LMDB's documentation: "use an environment only in the
process which opened it"), and a Redis client's sockets would likewise be
shared by two processes. So the master only creates the files; every worker
opens its own environment. `LocalStore` checks the pid on every call and
refuses an environment inherited across fork.

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
`decode_reply` checks every length, so nothing from LMDB or Redis is ever
unpickled or trusted to be well-formed.

Backends:

* local (`url = ""`): LMDB in a folder on tmpfs, shared by all the workers of
  one host, memory-mapped into each. Readers never block and never wait for a
  writer; a put is one write transaction that also expires and evicts (the entries
  stored longest ago first), so a reader sees a whole value or none and the byte
  total stays within `max_bytes`. Chosen over SQLite and diskcache by measurement:
  see docs/RESPONSE_CACHE.md.
* Redis (`url = "redis://host:port/db"`): same keys under a prefix, TTL via
  `SET ... PX`, short connect/read timeouts, no client retries, and a circuit
  breaker: after an error every call is an instant miss/drop for
  `redis_cooldown_seconds`, then one call probes again; it recovers by itself.

Counters: `CacheStats` (per process) plus an optional `on_event(name, backend,
value)` hook for Prometheus; this module never imports prometheus_client.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NewType, Protocol, TypeAlias

import lmdb
import orjson

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

    url: "" = local LMDB store shared by the workers of this host;
         "redis://host:port/db" (or rediss://, unix://) = Redis shared by several hosts.
    max_bytes: local store's total (keys + values + a per-row estimate); Redis is
         bounded by its own `maxmemory` + `maxmemory-policy allkeys-lru`.
    max_entry_bytes: an encoded reply larger than this is not stored (either backend).
    ttl_seconds: lifetime of an entry (local and Redis).
    redis_*_timeout_seconds: socket connect / read-write timeouts; the worst a
         request waits on a slow or dead Redis.
    redis_cooldown_seconds: after a Redis error, calls skip Redis this long, then
         one call probes it again.
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
    error_log_interval_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.max_bytes <= 0 or self.max_entry_bytes <= 0:
            raise ValueError("cache: max_bytes and max_entry_bytes must be > 0")
        if self.ttl_seconds <= 0:
            raise ValueError("cache: ttl_seconds must be > 0")
        for name in ("redis_connect_timeout_seconds", "redis_timeout_seconds"):
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
_KEY_DOMAIN: Final = b"onnxpool-rc-v3"


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
    # orjson, not json.dumps: the key is computed on every request, and json.dumps with
    # sort_keys builds an encoder per call (2.5 us against 0.13 us here, more on a cold path).
    return orjson.dumps(params, option=orjson.OPT_SORT_KEYS)


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
    return orjson.dumps(stripped, option=orjson.OPT_SORT_KEYS)


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


_SCHEMA_VERSION: Final = 2  # 1 was the SQLite store
_ROW_OVERHEAD: Final = 64  # per-entry bookkeeping counted against max_bytes (expiry, order record, page slack)
_PURGE_BATCH: Final = 64
_MAX_READERS: Final = 1024  # read transactions open at once, over all processes (gthread: one per thread)
# An entry's stamp: expiry (unix ms) and a store sequence number, big-endian, so byte
# order = expiry order, and entries stored in the same millisecond keep the order they came in.
_STAMP: Final = struct.Struct(">QQ")
_U64: Final = struct.Struct(">Q")
_LMDB_FILES: Final = ("data.mdb", "lock.mdb")


def _map_size(max_bytes: int) -> int:
    """The LMDB map: room for max_bytes of entries twice over (B-tree page slack, pages
    freed by a write that readers may still see) plus 32 MiB. Address space, not memory:
    tmpfs only holds the pages that were written."""
    return 2 * max_bytes + 32 * MiB


def _meta_number(txn: lmdb.Transaction, meta: lmdb._Database, name: bytes) -> int:
    raw = txn.get(name, db=meta)
    if raw is None:
        raise RuntimeError(f"response cache: the store has no {name.decode()} record")
    return int(_U64.unpack(raw)[0])


class LocalStore:
    """LMDB in a folder on tmpfs, shared by the worker processes of one host.

    `LocalStore.create(folder)` runs in the master before fork (fresh files every
    start); `LocalStore(folder, settings)` in each worker after fork. LMDB maps the
    file into every process: a get copies the value straight out of shared memory
    (no page cache to re-read after another process wrote, unlike SQLite), and a put
    is one write transaction, serialised over all processes by LMDB's robust mutex (a
    worker killed while holding it does not wedge the others).

    Three named databases in one environment, all changed in the same transaction:
    `entries` key -> stamp (expiry, sequence) + value; `order` stamp -> accounted size +
    key (the eviction and expiry order); `meta` -> byte and entry totals, the sequence.
    """

    name = "local"
    remote = False

    @staticmethod
    def exists(folder: str | os.PathLike[str]) -> bool:
        """Whether `create` already made the store in `folder` (a master keeps it across HUP)."""
        return (Path(folder) / _LMDB_FILES[0]).is_file()

    @staticmethod
    def create(folder: str | os.PathLike[str], max_bytes: int = 64 * MiB) -> Path:
        """Create the folder (0700) and a fresh, empty store; leaves nothing open."""
        path = Path(folder)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name in _LMDB_FILES:
            (path / name).unlink(missing_ok=True)
        env = lmdb.open(str(path), map_size=_map_size(max_bytes), max_dbs=3, max_readers=_MAX_READERS, sync=False)
        try:
            meta = env.open_db(b"meta")
            env.open_db(b"entries")
            env.open_db(b"order")
            with env.begin(write=True, db=meta) as txn:
                txn.put(b"version", _U64.pack(_SCHEMA_VERSION))
                txn.put(b"bytes", _U64.pack(0))
                txn.put(b"entries", _U64.pack(0))
                txn.put(b"seq", _U64.pack(0))
        finally:
            env.close()
        return path / _LMDB_FILES[0]

    def __init__(self, folder: str | os.PathLike[str], settings: CacheSettings) -> None:
        self.path = Path(folder)
        if not self.exists(folder):
            raise FileNotFoundError(f"{self.path}: the master must call prepare() before forking workers")
        self.max_bytes = settings.max_bytes
        self._pid = os.getpid()
        # sync=False: tmpfs, so flushing for power loss is meaningless; LMDB stays consistent
        # when a process dies at any point (a commit is one meta-page switch).
        self._env = lmdb.open(
            str(self.path),
            map_size=_map_size(settings.max_bytes),
            max_dbs=3,
            max_readers=_MAX_READERS,
            create=False,
            sync=False,
            metasync=False,
            readahead=False,
        )
        self._env.reader_check()  # free the reader slots of processes that died (a killed worker)
        self._meta = self._env.open_db(b"meta", create=False)
        self._entries = self._env.open_db(b"entries", create=False)
        self._order = self._env.open_db(b"order", create=False)
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(b"version")
        version = None if raw is None else _U64.unpack(raw)[0]
        if version != _SCHEMA_VERSION:
            self._env.close()
            raise RuntimeError(f"{self.path}: store version {version}, expected {_SCHEMA_VERSION}")

    def _begin(self, **options: Any) -> lmdb.Transaction:
        try:
            return self._env.begin(**options)
        except lmdb.MapResizedError:
            # A newer generation (HUP with a larger max_bytes) grew the map: adopt its size.
            self._env.set_mapsize(0)
            return self._env.begin(**options)

    def _check_pid(self) -> None:
        if os.getpid() != self._pid:
            raise RuntimeError("LocalStore was opened before fork: open it in each worker after fork")

    def get(self, key: CacheKey) -> bytes | None:
        self._check_pid()
        with self._begin(db=self._entries, buffers=True) as txn:
            raw = txn.get(key)
            if raw is None or _STAMP.unpack_from(raw)[0] <= time.time() * 1000:
                return None
            return bytes(raw[_STAMP.size :])  # copied while the read transaction still holds the page

    def put(self, key: CacheKey, value: bytes, ttl_seconds: float) -> Stored | None:
        self._check_pid()
        size = len(key) + len(value) + _ROW_OVERHEAD
        if size > self.max_bytes:
            return None
        try:
            return self._put(key, value, size, ttl_seconds, 0)
        except lmdb.MapFullError:
            # Page slack beyond the map's reserve (many values just over half a page): make
            # room for a quarter of the bound, then try once more.
            return self._put(key, value, size, ttl_seconds, self.max_bytes // 4)

    def _put(self, key: CacheKey, value: bytes, size: int, ttl_seconds: float, headroom: int) -> Stored:
        now = int(time.time() * 1000)
        with self._begin(write=True) as txn:
            total = _meta_number(txn, self._meta, b"bytes")
            count = _meta_number(txn, self._meta, b"entries")
            seq = _meta_number(txn, self._meta, b"seq") + 1
            stamp = _STAMP.pack(now + max(1, int(ttl_seconds * 1000)), seq)
            old = txn.get(key, db=self._entries)
            if old is not None:  # an overwrite (no-cache refresh, or two workers computed it)
                txn.delete(old[: _STAMP.size], db=self._order)
                total -= len(key) + len(old) - _STAMP.size + _ROW_OVERHEAD
                count -= 1
            expired = evicted = 0
            cursor = txn.cursor(db=self._order)
            # Oldest first: expired entries always go (at most a batch per put), then as many
            # more as the new entry needs room for.
            going = cursor.first()
            while going:
                is_expired = _STAMP.unpack_from(cursor.key())[0] <= now and expired < _PURGE_BATCH
                if not is_expired and total + size + headroom <= self.max_bytes:
                    break
                record = cursor.value()
                txn.delete(record[_U64.size :], db=self._entries)
                total -= _U64.unpack_from(record)[0]
                count -= 1
                if is_expired:
                    expired += 1
                else:
                    evicted += 1
                going = cursor.delete() and bool(cursor.key())  # moves to the next record, if any
            txn.put(key, stamp + value, db=self._entries)
            txn.put(stamp, _U64.pack(size) + key, db=self._order)
            total += size
            txn.put(b"bytes", _U64.pack(total), db=self._meta)
            txn.put(b"entries", _U64.pack(count + 1), db=self._meta)
            txn.put(b"seq", _U64.pack(seq), db=self._meta)
        return Stored(evicted, expired, total)

    def bytes_used(self) -> int | None:
        return self._total(b"bytes")

    def entries(self) -> int:
        return self._total(b"entries")

    def _total(self, name: bytes) -> int:
        self._check_pid()
        with self._env.begin(db=self._meta) as txn:
            return _meta_number(txn, self._meta, name)

    def audit(self) -> tuple[int, int]:
        """(bytes, entries) summed over the entries themselves, to check the totals against."""
        self._check_pid()
        with self._env.begin(db=self._order) as txn:
            sizes = [_U64.unpack_from(record)[0] for record in txn.cursor().iternext(keys=False, values=True)]
        return sum(sizes), len(sizes)

    def close(self) -> None:
        if os.getpid() != self._pid:  # never close a parent's environment in a child
            return
        self._env.close()


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
        LocalStore.create(folder, settings.max_bytes)


def open_cache(
    settings: CacheSettings, folder: str | os.PathLike[str], *, on_event: EventHook | None = None
) -> ResponseCache | None:
    """Worker, after fork: the worker's cache, or None when disabled."""
    if not settings.enabled:
        return None
    store: Store = RedisStore(settings) if settings.url else LocalStore(folder, settings)
    return ResponseCache(store, settings, on_event)
