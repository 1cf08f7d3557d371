"""The local store: LMDB in the run folder, memory-mapped by every worker of the host."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any, Final

import lmdb

from onnxpool.cache.backend import Stored
from onnxpool.cache.key import CacheKey
from onnxpool.config.settings import CacheSettings

MiB: Final = 1 << 20

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
