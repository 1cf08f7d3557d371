"""Throughput with Prometheus metrics on vs off: real gunicorn servers, v2 binary infer, concurrency 4.

Usage (from the repo root):
    .venv/bin/python -m benchmarks.metrics_overhead [--duration 20] [--concurrency 4] [--rounds 2] [--plot out/m.png]

Each run starts a fresh server ([metrics] enabled = true or false, everything
else default, demo model), drives it with `bench.loadgen` (`--concurrency`
closed-loop keep-alive connections) with binary-tensor infer requests for
`--warmup` + `--duration` seconds, counts the requests completed in the timed
window, and stops the server. Runs alternate
off/on `--rounds` times so drift on the machine hits both alike; the table
gives each mode's total, and the ratio on/off (the target: overhead < 3%).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from onnxpool.measure.loadgen import LoadGenerator, StepPlan, StepResult
from onnxpool.measure.payloads import prepare
from onnxpool.measure.progress import Progress
from onnxpool.measure.servers import MODEL_NAME, Server, start_server


@dataclass
class RunResult:
    """One server run: the load step's result and, with metrics on, what /metrics counted."""

    metrics: bool
    step: StepResult
    counted_by_server: float | None = None


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
    progress = Progress(sys.stderr)
    progress.status(f"metrics {'on' if metrics else 'off'}: starting a server", force=True)
    server = start_server(tmp, settings, workers=args.workers or None, name=f"metrics-{metrics}")
    try:
        request = prepare("v2-binary", server.url, model=MODEL_NAME, batch=args.batch)
        with LoadGenerator(server.url, request, args.concurrency) as load:
            plan = StepPlan(args.concurrency, warmup=args.warmup, duration=args.duration)
            step = load.run_step(plan, progress.status)
        progress.done(f"metrics {'on' if metrics else 'off'}: {step.throughput:.1f} req/s")
        return RunResult(metrics, step, infer_requests_counted(server) if metrics else None)
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
        counted = f"{r.counted_by_server:.0f}" if r.counted_by_server is not None else "-"
        print(
            f"{i:<4} {'on' if r.metrics else 'off':<8} {r.step.ok:>9} {r.step.throughput:>9.1f} "
            f"{r.step.percentile(50) * 1e3:>9.2f} {r.step.percentile(99) * 1e3:>9.2f} "
            f"{r.step.error_count:>9} {counted:>9}"
        )

    def rate(metrics: bool) -> float:
        steps = [r.step for r in results if r.metrics is metrics]
        return sum(s.ok for s in steps) / sum(s.seconds for s in steps)

    on, off = rate(True), rate(False)
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
