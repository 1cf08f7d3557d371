"""Response cache: keys, framing, Cache-Control, the local LMDB store across real forked
processes, and a real redis-server (Debian package) started, killed, stalled and restarted here."""

from __future__ import annotations

import hashlib
import inspect
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from onnxpool.cache.codec import CachedReply, CorruptEntry, decode_reply, encode_reply
from onnxpool.cache.control import CacheControl, parse_cache_control
from onnxpool.cache.key import CacheKey, cache_key, v2_request_payload
from onnxpool.cache.lmdb_store import LocalStore
from onnxpool.cache.policy import ResponseCache, open_cache, prepare
from onnxpool.cache.redis_store import RedisStore
from onnxpool.config.settings import CacheSettings
from tests.redis_harness import RedisServer

FORK = mp.get_context("fork")


def key_of(n: int | str) -> CacheKey:
    return cache_key(
        model_digest="m", settings_fingerprint="s", endpoint="/predict", params={}, payload=str(n).encode()
    )


def reply_of(body: bytes) -> CachedReply:
    return CachedReply(body=body, content_type="application/json", headers=(("Inference-Header-Content-Length", "42"),))


# --------------------------------------------------------------------------- key


BASE: dict[str, Any] = {
    "model_digest": "sha256:aaaa",
    "settings_fingerprint": "onnxpool 0.1.0; resize=256; crop=224; labels=imagenet",
    "endpoint": "/predict",
    "params": {"top_k": 5, "outputs": ["probs"], "binary": False},
    "payload": b"\xff\xd8jpeg bytes",
}


def test_key_is_stable_and_32_bytes() -> None:
    k1 = cache_key(**BASE)
    k2 = cache_key(**{**BASE, "params": {"binary": False, "outputs": ["probs"], "top_k": 5}})  # dict order
    assert k1 == k2
    assert len(k1) == 32
    assert k1 == cache_key(**{**BASE, "payload": [b"\xff\xd8jpeg bytes"]})  # bare bytes == one part
    assert k1 == cache_key(**{**BASE, "payload": memoryview(b"\xff\xd8jpeg bytes")})


@pytest.mark.parametrize(
    "change",
    [
        {"model_digest": "sha256:bbbb"},
        {"settings_fingerprint": "onnxpool 0.1.0; resize=256; crop=224; labels=other"},
        {"endpoint": "/classify"},
        {"params": {"top_k": 3, "outputs": ["probs"], "binary": False}},
        {"params": {"top_k": 5, "outputs": ["probs", "logits"], "binary": False}},
        {"params": {"top_k": 5, "outputs": ["probs"], "binary": True}},
        {"params": {"top_k": 5, "outputs": ["probs"]}},
        {"params": {"top_k": 5.0, "outputs": ["probs"], "binary": False}},
        {"payload": b"\xff\xd8jpeg byteS"},
        {"payload": [b"\xff\xd8jpeg", b" bytes"]},
    ],
)
def test_any_listed_input_changes_the_key(change: dict[str, Any]) -> None:
    assert cache_key(**{**BASE, **change}) != cache_key(**BASE)


def test_fields_are_length_prefixed() -> None:
    a = cache_key(**{**BASE, "model_digest": "ab", "settings_fingerprint": "c"})
    b = cache_key(**{**BASE, "model_digest": "a", "settings_fingerprint": "bc"})
    assert a != b
    assert cache_key(**{**BASE, "payload": [b"ab", b"c"]}) != cache_key(**{**BASE, "payload": [b"a", b"bc"]})
    assert cache_key(**{**BASE, "params": {"outputs": ["a", "b"]}}) != cache_key(
        **{**BASE, "params": {"outputs": ["b", "a"]}}
    )


def test_echo_only_ids_are_not_key_inputs() -> None:
    names = set(inspect.signature(cache_key).parameters)
    assert names == {"model_digest", "settings_fingerprint", "endpoint", "params", "payload"}
    req_a = {"id": "req-1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}
    req_b = {**req_a, "id": "another-id"}
    req_c = {**req_a, "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.5]}]}

    def key(request: dict[str, Any]) -> CacheKey:
        return cache_key(**{**BASE, "endpoint": "/v2/infer", "payload": [v2_request_payload(request), b"tail"]})

    assert key(req_a) == key(req_b)
    assert key(req_a) != key(req_c)
    assert b"req-1" not in v2_request_payload(req_a)


def test_unsupported_params_are_rejected() -> None:
    with pytest.raises(TypeError):
        cache_key(**{**BASE, "params": {"x": object()}})
    with pytest.raises(ValueError):
        cache_key(**{**BASE, "params": {"x": float("nan")}})


# --------------------------------------------------------------------------- framing


def test_reply_round_trip_is_byte_identical() -> None:
    body = os.urandom(5000)
    r = CachedReply(
        body=body, content_type="application/octet-stream", headers=(("Inference-Header-Content-Length", "17"),)
    )
    data = encode_reply(r)
    assert len(data) == len(body) + 11 + len("application/octet-stream") + 3 + 31 + 2
    out = decode_reply(data)
    assert out == r and out.body == body


def test_decode_rejects_truncated_and_garbage() -> None:
    data = encode_reply(reply_of(b"x" * 100))
    for bad in (data[:-1], data + b"y", data[:5], b"", b"ORC0" + data[4:], b"\x80" * 40):
        with pytest.raises(CorruptEntry):
            decode_reply(bad)


def test_header_injection_is_refused() -> None:
    with pytest.raises(ValueError):
        encode_reply(CachedReply(body=b"", content_type="text/plain", headers=(("X-A", "1\r\nSet-Cookie: a=b"),)))
    with pytest.raises(ValueError):
        encode_reply(CachedReply(body=b"", content_type="text/plain", headers=(("Bad Name", "1"),)))
    good = encode_reply(CachedReply(body=b"", content_type="text/plain", headers=(("X-A", "1xSet-Cookie: a=b"),)))
    with pytest.raises(CorruptEntry):
        decode_reply(good.replace(b"1x", b"\r\n"))


# --------------------------------------------------------------------------- Cache-Control


@pytest.mark.parametrize(
    ("header", "pragma", "read", "write"),
    [
        (None, None, True, True),
        ("", None, True, True),
        ("max-age=60", None, True, True),
        ("no-cache", None, False, True),
        ("No-Cache", None, False, True),
        ("max-age=0, no-cache", None, False, True),
        ('no-cache="set-cookie"', None, False, True),
        ("no-store", None, False, False),
        ("no-cache, no-store", None, False, False),
        (["max-age=5", "no-store"], None, False, False),
        (None, "no-cache", False, True),
        ("no-cachex", None, True, True),
    ],
)
def test_parse_cache_control(header: Any, pragma: str | None, read: bool, write: bool) -> None:
    assert parse_cache_control(header, pragma) == CacheControl(read=read, write=write)


def test_settings_validation() -> None:
    s = CacheSettings()
    assert s.enabled and s.url == "" and s.backend_name == "local"
    assert CacheSettings(url="redis://h:6379/0").backend_name == "redis"
    for bad in ({"url": "http://x"}, {"max_bytes": 0}, {"ttl_seconds": 0}, {"redis_timeout_seconds": 0}):
        with pytest.raises(ValueError):
            CacheSettings(**bad)


# --------------------------------------------------------------------------- local store


def store_settings(**kw: Any) -> CacheSettings:
    """`[cache]` settings for the store's own tests, which bound it in KB to see eviction
    (a configured cache is at least 1 MiB: that bound is the settings' check, tested above)."""
    return CacheSettings.model_construct(**{**CacheSettings().model_dump(), **kw})


def local_cache(folder: Path, **kw: Any) -> ResponseCache:
    settings = store_settings(**kw)
    prepare(settings, folder)
    cache = open_cache(settings, folder)
    assert cache is not None
    return cache


def test_disabled_is_none(tmp_path: Path) -> None:
    settings = CacheSettings(enabled=False)
    prepare(settings, tmp_path / "c")
    assert not (tmp_path / "c").exists()
    assert open_cache(settings, tmp_path / "c") is None


def test_open_without_prepare_fails_loudly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="prepare"):
        open_cache(CacheSettings(), tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()


def test_local_round_trip_and_counters(tmp_path: Path) -> None:
    events: list[tuple[str, str, float]] = []
    settings = CacheSettings()
    prepare(settings, tmp_path)
    cache = open_cache(settings, tmp_path, on_event=lambda *e: events.append(e))
    assert cache is not None
    body = os.urandom(1024)
    k = key_of(1)
    assert cache.lookup(k) is None
    stored = cache.store_reply(k, 200, reply_of(body))
    assert stored is not None and stored.bytes_used == len(k) + len(encode_reply(reply_of(body))) + 64
    hit = cache.lookup(k)
    assert hit == reply_of(body) and hit is not None and hit.body == body
    s = cache.stats
    assert (s.hits, s.misses, s.stores, s.lookups) == (1, 1, 1, 2)
    assert 0 < s.lookup_seconds < 0.1
    assert [e[0] for e in events] == ["lookup", "miss", "store", "lookup", "hit"]
    assert {e[1] for e in events} == {"local"}
    assert cache.bytes_used() == len(k) + len(encode_reply(reply_of(body))) + 64
    # replacing an entry keeps the accounting exact
    stored = cache.store_reply(k, 200, reply_of(b"short"))
    assert stored is not None and stored.bytes_used == cache.bytes_used()
    assert cache.bytes_used() == len(k) + len(encode_reply(reply_of(b"short"))) + 64
    cache.close()


def test_errors_and_no_store_are_never_stored(tmp_path: Path) -> None:
    cache = local_cache(tmp_path)
    k = key_of(2)
    for status in (400, 404, 500, 503, 201):
        assert not cache.store_reply(k, status, reply_of(b"{}"))
    assert not cache.store_reply(k, 200, reply_of(b"{}"), parse_cache_control("no-store"))
    assert cache.lookup(k) is None
    assert cache.stats.stores == 0 and cache.stats.skipped == 5
    bad = CachedReply(body=b"{}", content_type="application/json", headers=(("X-Label", "caf\u00e9"),))
    assert not cache.store_reply(k, 200, bad)  # an unstorable header is a skip, not an exception
    assert cache.stats.skipped == 6


def test_no_cache_refreshes_and_no_store_bypasses(tmp_path: Path) -> None:
    cache = local_cache(tmp_path)
    k = key_of(3)
    cache.store_reply(k, 200, reply_of(b"old"))
    no_cache, no_store = parse_cache_control("no-cache"), parse_cache_control("no-store")
    assert cache.lookup(k, no_cache) is None  # forced to compute...
    assert cache.store_reply(k, 200, reply_of(b"new"), no_cache)  # ...and the entry is refreshed
    assert cache.lookup(k, no_store) is None
    assert not cache.store_reply(k, 200, reply_of(b"ignored"), no_store)
    hit = cache.lookup(k)
    assert hit is not None and hit.body == b"new"


def check_expires(cache: ResponseCache) -> None:
    """An entry is served until its TTL has passed, then no more."""
    cache.store_reply(key_of(1), 200, reply_of(b"a"))
    assert cache.lookup(key_of(1)) is not None
    time.sleep(cache.settings.ttl_seconds * 1.5)
    assert cache.lookup(key_of(1)) is None


def test_ttl_expiry(tmp_path: Path) -> None:
    cache = local_cache(tmp_path, ttl_seconds=0.3)
    check_expires(cache)
    cache.store_reply(key_of(2), 200, reply_of(b"b"))  # a put purges what expired
    assert cache.stats.expirations == 1
    assert isinstance(cache.store, LocalStore) and cache.store.entries() == 1


def test_size_bound_evicts_oldest(tmp_path: Path) -> None:
    entry = 32 + len(encode_reply(reply_of(b"x" * 1000))) + 64
    cache = local_cache(tmp_path, max_bytes=10 * entry, max_entry_bytes=4096)
    for i in range(30):
        assert cache.store_reply(key_of(i), 200, reply_of(b"x" * 1000))
        used = cache.bytes_used()
        assert used is not None and used <= 10 * entry
    assert cache.bytes_used() == 10 * entry
    assert cache.stats.evictions == 20
    assert all(cache.lookup(key_of(i)) is None for i in range(20))
    assert all(cache.lookup(key_of(i)) is not None for i in range(20, 30))
    # one big entry evicts as many small ones as it needs
    assert cache.store_reply(key_of("big"), 200, reply_of(b"y" * 3000))
    used = cache.bytes_used()
    assert used is not None and used <= 10 * entry
    assert cache.stats.evictions == 23


def test_oversize_entry_is_not_stored(tmp_path: Path) -> None:
    cache = local_cache(tmp_path, max_entry_bytes=2048)
    assert not cache.store_reply(key_of(1), 200, reply_of(b"z" * 4096))
    assert cache.lookup(key_of(1)) is None
    assert cache.stats.skipped == 1 and cache.bytes_used() == 0
    # an entry within max_entry_bytes but over the whole store's bound is not stored either
    small = local_cache(tmp_path / "small", max_bytes=1000, max_entry_bytes=4096)
    assert not small.store_reply(key_of(1), 200, reply_of(b"z" * 2000))
    assert small.stats.skipped == 1


_TRUNCATE_EVERY_ENTRY = """
import sys, lmdb
env = lmdb.open(sys.argv[1], max_dbs=3, create=False, map_size=256 << 20)
entries = env.open_db(b"entries", create=False)
with env.begin(write=True, db=entries) as txn:
    for key, value in list(txn.cursor()):
        txn.put(key, value[:12])
env.close()
"""


def test_corrupt_entry_is_a_counted_miss(tmp_path: Path) -> None:
    cache = local_cache(tmp_path)
    k = key_of(1)
    cache.store_reply(k, 200, reply_of(b"abc"))
    # another process (py-lmdb refuses a second environment on one path in a process)
    subprocess.run([sys.executable, "-c", _TRUNCATE_EVERY_ENTRY, str(tmp_path)], check=True, timeout=60)
    assert cache.lookup(k) is None
    assert cache.stats.error_count("local") == 1 and cache.stats.misses == 1


def _child(target: Callable[..., Any], *args: Any) -> int:
    p = FORK.Process(target=target, args=args)
    p.start()
    p.join(30)
    assert p.exitcode is not None, "child hung"
    return p.exitcode


def _write_in_child(folder: str, body: bytes) -> None:
    cache = open_cache(CacheSettings(), folder)  # opened AFTER fork, as a worker does
    assert cache is not None
    os._exit(0 if cache.store_reply(key_of("shared"), 200, reply_of(body)) else 3)


def _read_in_child(folder: str, body: bytes) -> None:
    cache = open_cache(CacheSettings(), folder)
    assert cache is not None
    hit = cache.lookup(key_of("shared"))
    os._exit(0 if hit is not None and hit.body == body else 4)


def test_hit_across_forked_processes(tmp_path: Path) -> None:
    prepare(CacheSettings(), tmp_path)  # the "master": creates, opens nothing
    body = os.urandom(1024)
    assert _child(_write_in_child, str(tmp_path), body) == 0  # worker A computes and stores
    assert _child(_read_in_child, str(tmp_path), body) == 0  # worker B hits


def _use_inherited(cache: ResponseCache) -> None:
    try:
        cache.store.get(key_of(1))
    except RuntimeError as exc:
        os._exit(0 if "after fork" in str(exc) else 5)
    os._exit(6)


def test_store_opened_before_fork_is_refused_in_the_child(tmp_path: Path) -> None:
    cache = local_cache(tmp_path)
    assert _child(_use_inherited, cache) == 0
    cache.store_reply(key_of(1), 200, reply_of(b"parent still fine"))
    assert cache.lookup(key_of(1)) is not None


def _payload(i: int, gen: int) -> bytes:
    """A self-verifying body: 32-byte digest of the rest, then 1-3 KB derived from (key, generation)."""
    seed = hashlib.blake2b(f"{i}/{gen}".encode()).digest()
    rest = seed * (16 + (gen % 3) * 16)
    return hashlib.sha256(rest).digest() + rest


def _writer(folder: str, seconds: float, n_keys: int) -> None:
    cache = open_cache(store_settings(max_bytes=60_000), folder)
    assert cache is not None
    end, gen = time.monotonic() + seconds, os.getpid() * 1_000_000
    while time.monotonic() < end:
        gen += 1
        cache.store_reply(key_of(gen % n_keys), 200, reply_of(_payload(gen % n_keys, gen)))
    os._exit(0 if cache.stats.stores > 0 else 7)


def _reader(folder: str, seconds: float, n_keys: int, out: Any) -> None:
    cache = open_cache(CacheSettings(), folder)
    assert cache is not None
    hits = torn = i = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        i += 1
        r = cache.lookup(key_of(i % n_keys))
        if r is not None:
            hits += 1
            if hashlib.sha256(r.body[32:]).digest() != r.body[:32]:
                torn += 1
    out.put((hits, torn, cache.stats.error_count("local")))
    out.close()
    out.join_thread()  # flush the queue before leaving without cleanup
    os._exit(0)


def test_concurrent_writers_never_tear_a_value(tmp_path: Path) -> None:
    # 3 writer processes overwrite the same 40 keys with values of varying size while a
    # small bound (60 KB) makes every put evict; a reader checks every hit.
    prepare(CacheSettings(), tmp_path)
    q = FORK.Queue()
    procs = [FORK.Process(target=_writer, args=(str(tmp_path), 2.0, 40)) for _ in range(3)]
    procs.append(FORK.Process(target=_reader, args=(str(tmp_path), 2.0, 40, q)))
    for p in procs:
        p.start()
    hits, torn, errors = q.get(timeout=30)
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert hits > 100 and torn == 0 and errors == 0
    opened = open_cache(store_settings(max_bytes=60_000), tmp_path)
    assert opened is not None and isinstance(opened.store, LocalStore)
    store = opened.store
    total, count = store.audit()
    assert (store.bytes_used(), store.entries()) == (total, count)  # accounting exact under concurrent puts
    assert total <= 60_000


# --------------------------------------------------------------------------- redis


def redis_cache(srv: RedisServer, **kw: Any) -> ResponseCache:
    settings = CacheSettings(url=srv.url, **kw)
    prepare(settings, "/nonexistent/not-used-for-redis")
    cache = open_cache(settings, "/nonexistent/not-used-for-redis")
    assert cache is not None and isinstance(cache.store, RedisStore)
    return cache


def test_redis_hit_across_two_hosts(redis_server: RedisServer) -> None:
    host_a, host_b = redis_cache(redis_server, ttl_seconds=30), redis_cache(redis_server, ttl_seconds=30)
    body = os.urandom(10_000)
    k = key_of("cat")
    assert host_b.lookup(k) is None
    assert host_a.store_reply(k, 200, reply_of(body))
    hit = host_b.lookup(k)
    assert hit is not None and hit.body == body and hit == reply_of(body)
    assert host_b.stats.hits == 1 and host_b.stats.misses == 1
    assert host_b.bytes_used() is None
    store = host_a.store
    assert isinstance(store, RedisStore)
    assert store.client.keys("*") == [b"onnxpool:rc1:" + k.hex().encode()]
    assert 29_000 < int(store.client.pttl(b"onnxpool:rc1:" + k.hex().encode())) <= 30_000
    assert not host_a.store_reply(key_of("big"), 200, reply_of(b"x" * (2 * 1024 * 1024)))  # > max_entry_bytes
    assert not host_a.store_reply(key_of("err"), 500, reply_of(b"{}"))
    assert store.client.dbsize() == 1
    host_a.close()
    host_b.close()


def test_redis_ttl_expires(redis_server: RedisServer) -> None:
    cache = redis_cache(redis_server, ttl_seconds=0.2)
    check_expires(cache)
    cache.close()


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.monotonic()
    out = fn()
    return out, time.monotonic() - t


def test_redis_killed_mid_use_then_back(redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="onnxpool.cache")
    cache = redis_cache(
        redis_server, redis_connect_timeout_seconds=0.05, redis_timeout_seconds=0.1, redis_cooldown_seconds=0.5
    )
    budget = 0.05 + 0.1 + 0.15  # both timeouts plus slack for a loaded 2-core machine
    k = key_of("x")
    assert cache.store_reply(k, 200, reply_of(b"computed"))
    assert cache.lookup(k) is not None

    redis_server.kill()
    hit, took = _timed(lambda: cache.lookup(k))
    assert hit is None and took < budget
    assert cache.stats.error_count("redis") == 1
    # breaker open: no waiting at all, no more errors, puts dropped
    for _ in range(50):
        (hit, took) = _timed(lambda: cache.lookup(k))
        assert hit is None and took < 0.01
        stored, took = _timed(lambda: cache.store_reply(k, 200, reply_of(b"computed")))
        assert not stored and took < 0.01
    assert cache.stats.error_count("redis") == 1
    time.sleep(0.6)  # cooldown over: the next call probes (and fails fast again: connection refused)
    stored, took = _timed(lambda: cache.store_reply(k, 200, reply_of(b"computed")))
    assert not stored and took < budget
    assert cache.stats.error_count("redis") == 2
    warnings = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(warnings) == 1  # logged at most once per interval (default 60 s)

    redis_server.start()  # same port, empty (no persistence)
    time.sleep(0.6)
    assert cache.lookup(k) is None  # recovered by itself: a real miss, not an error
    assert cache.stats.error_count("redis") == 2
    assert cache.store_reply(k, 200, reply_of(b"computed"))
    hit = cache.lookup(k)
    assert hit is not None and hit.body == b"computed"
    assert any("is back" in r.getMessage() for r in caplog.records)
    cache.close()


def test_redis_stalled_times_out(redis_server: RedisServer) -> None:
    cache = redis_cache(redis_server, redis_timeout_seconds=0.1, redis_cooldown_seconds=0.3)
    k = key_of("s")
    assert cache.store_reply(k, 200, reply_of(b"v"))
    assert redis_server.proc is not None
    os.kill(redis_server.proc.pid, signal.SIGSTOP)  # alive, accepting nothing: a hung Redis
    try:
        hit, took = _timed(lambda: cache.lookup(k))
        assert hit is None and 0.09 < took < 0.35
        assert cache.stats.error_count("redis") == 1
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    time.sleep(0.35)
    hit = cache.lookup(k)
    assert hit is not None and hit.body == b"v"
    cache.close()
