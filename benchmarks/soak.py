"""Soak: drive a server for a while with good and bad requests; report errors, restarts, RSS.

    .venv/bin/python -m benchmarks.soak                      # starts its own server (2 workers), 10 minutes
    .venv/bin/python -m benchmarks.soak --duration 20        # smoke run
    .venv/bin/python -m benchmarks.soak --url http://127.0.0.1:8000 --master-pid 1234

The mix: valid infer (JSON and binary), malformed JSON, wrong shapes, an
oversized body, an unknown model and, when the server has /predict, good and
bad images. It prints a progress line every few seconds and, at the end,
requests and errors by class (2xx/4xx/5xx/connection) per kind, worker
restarts (the set of the master's child pids changed) and each worker's RSS
after warm-up and at the end (VmRSS from /proc). Pass criteria the issue asks
for (0 5xx, RSS growth < 5 % per worker) are printed, not enforced.
"""

from __future__ import annotations

import argparse
import collections
import random
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import requests

from onnxpool.measure.servers import DATA, children_of, proc_status, start_server
from onnxpool.server.v2codec import encode_infer_request

MODEL = "efficientnet-lite0"
Shot = Callable[[requests.Session, str], requests.Response]


def _infer(session: requests.Session, url: str, body: bytes, headers: dict[str, str]) -> requests.Response:
    return session.post(f"{url}/v2/models/{MODEL}/infer", data=body, headers=headers, timeout=30)


def build_mix(max_body: int, has_predict: bool) -> dict[str, tuple[int, Shot]]:
    """Request kinds with their weights; each sends one request."""
    image = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    as_json = encode_infer_request({"input": image})
    as_binary = encode_infer_request({"input": image}, {"input"}, binary_output=True)
    wrong_shape = encode_infer_request({"input": image[:, :, :100]})
    json_headers = as_json.headers
    binary_headers = as_binary.headers
    oversized = b"[" + b"0," * (max_body // 2 + 1024) + b"0]"
    mix: dict[str, tuple[int, Shot]] = {
        "infer_json": (30, lambda s, u: _infer(s, u, as_json.body, json_headers)),
        "infer_binary": (30, lambda s, u: _infer(s, u, as_binary.body, binary_headers)),
        "malformed_json": (8, lambda s, u: _infer(s, u, as_json.body[:-7], json_headers)),
        "wrong_shape": (8, lambda s, u: _infer(s, u, wrong_shape.body, json_headers)),
        "oversized": (3, lambda s, u: _infer(s, u, oversized, json_headers)),
        "unknown_model": (5, lambda s, u: s.post(f"{u}/v2/models/../../etc/infer", data=b"{}", timeout=30)),
    }
    if has_predict:
        cat = (DATA / "chelsea-cat.jpg").read_bytes()
        mix["predict_image"] = (12, lambda s, u: s.post(f"{u}/predict", files={"image": cat}, timeout=30))
        mix["predict_bad_image"] = (
            4,
            lambda s, u: s.post(f"{u}/predict", data=cat[: len(cat) // 3], headers={"Content-Type": "image/jpeg"}),
        )
    return mix


def status_class(status: int | None) -> str:
    return "connection" if status is None else f"{status // 100}xx"


def rss_kib(pid: int) -> int | None:
    try:
        return int(proc_status(pid)["VmRSS"].split()[0])
    except (FileNotFoundError, KeyError, ProcessLookupError):
        return None


def run(url: str, master_pid: int, duration: float, clients: int, max_body: int, warmup: int = 10) -> int:
    has_predict = requests.post(f"{url}/predict", timeout=10).status_code != 404
    mix = build_mix(max_body, has_predict)
    kinds = list(mix)
    weights = [mix[k][0] for k in kinds]
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    lock = threading.Lock()

    # warm-up: every kind `warmup` times (allocator pools settle), then RSS is the baseline
    print(f"warm-up: {warmup} requests of each kind; /predict {'found' if has_predict else 'absent'}", flush=True)
    with requests.Session() as session:
        for kind in kinds * warmup:
            mix[kind][1](session, url)
    start_workers = {pid: rss_kib(pid) for pid in children_of(master_pid)}
    seen_workers = set(start_workers)
    deadline = time.monotonic() + duration

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with requests.Session() as session:
            while time.monotonic() < deadline:
                kind = rng.choices(kinds, weights)[0]
                try:
                    status: int | None = mix[kind][1](session, url).status_code
                except requests.RequestException:
                    status = None
                    session.close()
                with lock:
                    counts[kind][status_class(status)] += 1

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    began = time.monotonic()
    while any(t.is_alive() for t in threads):
        time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))
        seen_workers.update(children_of(master_pid))
        with lock:
            total = sum(sum(c.values()) for c in counts.values())
            by_class = sum((c for c in counts.values()), collections.Counter[str]())
        print(f"[{time.monotonic() - began:6.0f}s] {total} requests {dict(sorted(by_class.items()))}", flush=True)
    end_workers = {pid: rss_kib(pid) for pid in children_of(master_pid)}
    return report(counts, start_workers, end_workers, seen_workers, time.monotonic() - began)


def report(
    counts: dict[str, collections.Counter[str]],
    start: dict[int, int | None],
    end: dict[int, int | None],
    seen: set[int],
    seconds: float,
) -> int:
    classes = ["2xx", "4xx", "5xx", "connection"]
    print(f"\n{'kind':<18}" + "".join(f"{c:>12}" for c in classes))
    for kind, counter in sorted(counts.items()):
        print(f"{kind:<18}" + "".join(f"{counter[c]:>12}" for c in classes))
    totals = sum(counts.values(), collections.Counter[str]())
    print(f"{'total':<18}" + "".join(f"{totals[c]:>12}" for c in classes))
    print(f"\n{sum(totals.values())} requests in {seconds:.0f} s ({sum(totals.values()) / seconds:.1f}/s)")
    restarts = len(seen - set(start))
    print(f"worker restarts: {restarts} (workers at start {sorted(start)}, at end {sorted(end)})")
    worst = 0.0
    for pid, before in sorted(start.items()):
        after = end.get(pid)
        if before and after:
            growth = (after - before) / before * 100
            worst = max(worst, growth)
            print(f"worker {pid}: RSS {before / 1024:.1f} MiB -> {after / 1024:.1f} MiB ({growth:+.1f} %)")
        else:
            print(f"worker {pid}: RSS {before} KiB -> gone")
    ok = totals["5xx"] == 0 and restarts == 0 and worst < 5.0
    print(f"\n{'PASS' if ok else 'FAIL'}: 5xx={totals['5xx']}, restarts={restarts}, worst RSS growth {worst:+.1f} %")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds to run (default 600)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client threads (default 4)")
    parser.add_argument("--url", help="server to drive (default: start one)")
    parser.add_argument("--master-pid", type=int, help="gunicorn master pid of --url (for workers and RSS)")
    parser.add_argument("--workers", type=int, default=2, help="workers of the server started here")
    parser.add_argument("--warmup", type=int, default=10, help="requests of each kind before the RSS baseline")
    parser.add_argument("--max-body", type=int, default=16 * 1024 * 1024, help="the server's max_body_bytes")
    args = parser.parse_args(argv)
    if args.url:
        if not args.master_pid:
            parser.error("--url needs --master-pid (workers and their RSS are read from /proc)")
        return run(args.url.rstrip("/"), args.master_pid, args.duration, args.clients, args.max_body, args.warmup)
    with tempfile.TemporaryDirectory(prefix="onnxpool-soak-") as tmp:
        max_body = 4 * 1024 * 1024  # above a JSON image tensor (~1.7 MB), so "oversized" stays cheap
        settings = {"ONNXPOOL_SERVER__WORKERS": str(args.workers), "ONNXPOOL_SERVER__MAX_BODY_BYTES": str(max_body)}
        print(f"starting a server with {args.workers} workers ...", flush=True)
        server = start_server(Path(tmp), settings, workers=args.workers)
        try:
            return run(server.url, server.pid, args.duration, args.clients, max_body, args.warmup)
        finally:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
