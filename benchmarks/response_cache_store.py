"""Micro-benchmark of the response cache (not a test): lookup latency of a hit.

    .venv/bin/python -m benchmarks.response_cache_store [--redis-url redis://127.0.0.1:6379/0] [--n 20000]

Local store: a fresh LMDB store in a tmpfs folder (/dev/shm) filled with 2000
entries; measures ResponseCache.lookup (get + decode + counters) for 1 KB and
10 KB bodies, then the same lookup and a store of a new entry while 2 other
processes put in a loop (what a worker sees while the others compute).
Also times cache_key over a JPEG-sized payload (the key is computed on every request).
Redis: lookup on a redis:// url (loopback) if given.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial

from onnxpool.cache.codec import CachedReply
from onnxpool.cache.key import CacheKey, cache_key
from onnxpool.cache.policy import ResponseCache, open_cache, prepare
from onnxpool.config.settings import CacheSettings


def pct(samples: list[int], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * p))] / 1000.0  # microseconds


def timeit(fn: Callable[[], object], n: int) -> tuple[float, float]:
    for _ in range(min(n, 1000)):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t)
    return pct(out, 0.5), pct(out, 0.99)


def key(i: int) -> CacheKey:
    return cache_key(
        model_digest="m", settings_fingerprint="s", endpoint="/predict", params={"top_k": 5}, payload=b"%d" % i
    )


def _writer(folder: str, seconds: float, size: int) -> None:
    cache = open_cache(CacheSettings(), folder)
    assert cache is not None
    end, i = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        i += 1
        cache.store_reply(key(10_000 + i % 500), 200, CachedReply(os.urandom(size), "application/json"))
    os._exit(0)


def _store_new(cache: ResponseCache, numbers: Iterator[int], body: bytes) -> None:
    cache.store_reply(key(next(numbers)), 200, CachedReply(body, "application/json"))


def fill(cache: ResponseCache, size: int) -> CachedReply:
    reply = CachedReply(os.urandom(size), "application/json", (("Inference-Header-Content-Length", "123"),))
    for i in range(2000):
        cache.store_reply(key(i), 200, CachedReply(os.urandom(size), "application/json"))
    cache.store_reply(key(-1), 200, reply)
    return reply


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--redis-url", default="")
    args = ap.parse_args()

    payload = os.urandom(35_000)  # about the cat photo's size
    p50, p99 = timeit(
        lambda: cache_key(
            model_digest="sha256:" + "a" * 64,
            settings_fingerprint="x" * 100,
            endpoint="/predict",
            params={"top_k": 5, "binary": False},
            payload=[payload],
        ),
        args.n,
    )
    print(f"cache_key over 35 KB payload: p50 {p50:.1f} us  p99 {p99:.1f} us")

    for size in (1024, 10 * 1024):
        folder = tempfile.mkdtemp(prefix="onnxpool-cache-", dir="/dev/shm")
        try:
            settings = CacheSettings()
            prepare(settings, folder)
            cache = open_cache(settings, folder)
            assert cache is not None
            reply = fill(cache, size)
            got = cache.lookup(key(-1))
            assert got == reply
            p50, p99 = timeit(partial(cache.lookup, key(-1)), args.n)
            print(f"local lookup hit {size // 1024:>2} KB: p50 {p50:.1f} us  p99 {p99:.1f} us")
            p50, p99 = timeit(partial(cache.lookup, key(-2)), args.n)
            print(f"local lookup miss        : p50 {p50:.1f} us  p99 {p99:.1f} us")
            # spawn, not fork: this process has the store open (py-lmdb refuses a second
            # environment on one path in a process, and a forked child inherits that state)
            ctx = mp.get_context("spawn")
            writers = [ctx.Process(target=_writer, args=(folder, 8.0, size)) for _ in range(2)]
            for w in writers:
                w.start()
            time.sleep(2.0)  # the interpreters start
            p50, p99 = timeit(partial(cache.lookup, key(-1)), min(args.n, 20000))
            print(
                f"local lookup hit {size // 1024:>2} KB with 2 processes putting in a loop: "
                f"p50 {p50:.1f} us  p99 {p99:.1f} us"
            )
            p50, p99 = timeit(partial(_store_new, cache, iter(range(20_000, 10**9)), os.urandom(size)), 2000)
            print(
                f"local store {size // 1024:>2} KB with 2 processes putting in a loop: "
                f"p50 {p50:.1f} us  p99 {p99:.1f} us"
            )
            for w in writers:
                w.join()
            cache.close()
        finally:
            shutil.rmtree(folder)

    if args.redis_url:
        cache = open_cache(CacheSettings(url=args.redis_url), "")
        assert cache is not None
        for size in (1024, 10 * 1024):
            reply = CachedReply(os.urandom(size), "application/json")
            cache.store_reply(key(-1), 200, reply)
            assert cache.lookup(key(-1)) == reply
            p50, p99 = timeit(partial(cache.lookup, key(-1)), min(args.n, 10000))
            print(f"redis lookup hit {size // 1024:>2} KB (loopback): p50 {p50:.1f} us  p99 {p99:.1f} us")
        cache.close()


if __name__ == "__main__":
    main()
