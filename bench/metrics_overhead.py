"""Throughput with Prometheus metrics on vs off: real gunicorn servers, v2 binary infer, concurrency 4.

Usage (from the repo root):
    .venv/bin/python bench/metrics_overhead.py [--duration 20] [--concurrency 4] [--rounds 2] [--plot out/m.png]

Each run starts a fresh server ([metrics] enabled = true or false, everything
else default, demo model), drives it from `--concurrency` client threads with
binary-tensor infer requests for `--warmup` + `--duration` seconds, counts the
requests completed in the timed window, and stops the server. Runs alternate
off/on `--rounds` times so drift on the machine hits both alike; the table
gives each mode's total, and the ratio on/off (the target: overhead < 3%).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a script from anywhere, without installing

import argparse  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import numpy as np  # noqa: E402
import requests  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.harness import MODEL_NAME, Server, start_server  # noqa: E402
from tests.v2_binary import binary_infer_request  # noqa: E402

INFER_URL = f"/v2/models/{MODEL_NAME}/infer"


@dataclass
class RunResult:
    """One server run: requests completed in the timed window and their latencies."""

    metrics: bool
    seconds: float
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    counted_by_server: float | None = None

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds


def drive(server: Server, concurrency: int, warmup: float, duration: float, batch: int) -> tuple[list[float], int]:
    """Closed-loop load: each thread sends the next request when the previous one is answered."""
    body, headers = binary_infer_request("input", np.random.default_rng(0).random((batch, 3, 224, 224), np.float32))
    start = time.monotonic()
    window = (start + warmup, start + warmup + duration)
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def client() -> None:
        session = requests.Session()
        while (now := time.monotonic()) < window[1]:
            try:
                reply = session.post(server.url + INFER_URL, data=body, headers=headers, timeout=30)
                ok = reply.status_code == 200
            except requests.RequestException:
                ok = False
            done = time.monotonic()
            if window[0] <= now and done <= window[1]:
                with lock:
                    if ok:
                        latencies.append(done - now)
                    else:
                        errors[0] += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        elapsed = min(time.monotonic() - start, warmup + duration)
        print(f"\r    {elapsed:5.1f}/{warmup + duration:.0f} s", end="", file=sys.stderr, flush=True)
        time.sleep(0.5)
    print(file=sys.stderr)
    return latencies, errors[0]


def infer_requests_counted(server: Server) -> float:
    text = requests.get(server.url + "/metrics", timeout=10).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "onnxpool_requests_total" and s.labels.get("endpoint") == "/v2/models/<model>/infer"
    )


def run(metrics: bool, args: argparse.Namespace, tmp: Path) -> RunResult:
    settings = {"ONNXPOOL_METRICS__ENABLED": "true" if metrics else "false"}
    if args.workers:
        settings["ONNXPOOL_SERVER__WORKERS"] = str(args.workers)
    print(f"  metrics {'on ' if metrics else 'off'}: starting a server", file=sys.stderr, flush=True)
    server = start_server(tmp, settings, workers=args.workers or None, name=f"metrics-{metrics}")
    try:
        latencies, errors = drive(server, args.concurrency, args.warmup, args.duration, args.batch)
        result = RunResult(metrics, args.duration, latencies, errors)
        if metrics:
            result.counted_by_server = infer_requests_counted(server)
        return result
    finally:
        server.stop()


def plot(on: float, off: float, path: Path) -> None:
    """Two bars (requests/s, off vs on), drawn with Pillow."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (560, 150), "white")
    draw = ImageDraw.Draw(im)
    draw.text((10, 10), f"requests/s at the same load; on/off = {on / off:.3f}", fill="black")
    top = max(on, off)
    for row, (name, value) in enumerate((("metrics off", off), ("metrics on", on))):
        y = 40 + row * 50
        draw.text((10, y + 10), name, fill="black")
        draw.rectangle((110, y, 110 + int(360 * value / top), y + 30), fill=(40, 100, 200))
        draw.text((120 + int(360 * value / top), y + 10), f"{value:.1f}", fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    im.save(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=20.0, help="timed seconds per run (default 20)")
    parser.add_argument("--warmup", type=float, default=2.0, help="untimed seconds first (default 2)")
    parser.add_argument("--concurrency", type=int, default=4, help="client threads (default 4)")
    parser.add_argument("--rounds", type=int, default=1, help="off/on pairs, alternated (default 1)")
    parser.add_argument("--batch", type=int, default=1, help="images per request (default 1)")
    parser.add_argument("--workers", type=int, default=0, help="server workers (default: auto)")
    parser.add_argument("--plot", type=Path, help="also write a bar chart PNG here")
    args = parser.parse_args(argv)

    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="onnxpool-bench-") as tmp:
        for round_no in range(args.rounds):
            order = (False, True) if round_no % 2 == 0 else (True, False)
            for metrics in order:
                results.append(run(metrics, args, Path(tmp)))

    print(
        f"v2 binary infer, batch {args.batch}, concurrency {args.concurrency}, "
        f"{args.duration:g} s timed per run, {args.rounds} round(s)"
    )
    head = ("requests", "req/s", "p50 ms", "p99 ms", "errors", "counted")
    print(f"{'run':<4} {'metrics':<8} " + " ".join(f"{h:>9}" for h in head))
    for i, r in enumerate(results, 1):
        lat = np.asarray(r.latencies) * 1e3 if r.latencies else np.zeros(1)
        counted = f"{r.counted_by_server:.0f}" if r.counted_by_server is not None else "-"
        print(
            f"{i:<4} {'on' if r.metrics else 'off':<8} {len(r.latencies):>9} {r.throughput:>9.1f} "
            f"{np.percentile(lat, 50):>9.2f} {np.percentile(lat, 99):>9.2f} {r.errors:>9} {counted:>9}"
        )
    on = sum(len(r.latencies) for r in results if r.metrics) / sum(r.seconds for r in results if r.metrics)
    off = sum(len(r.latencies) for r in results if not r.metrics) / sum(r.seconds for r in results if not r.metrics)
    ratio = on / off if off else float("nan")
    print(f"{'all':<4} {'off':<8} {'':>9} {off:>9.1f}")
    print(f"{'all':<4} {'on':<8} {'':>9} {on:>9.1f}")
    print(f"ratio on/off = {ratio:.3f}  -> metrics overhead {100 * (1 - ratio):+.1f}% of throughput (target < 3%)")
    if args.plot:
        plot(on, off, args.plot)
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
