"""The response cache, measured in one run: a hit's server time, the gain with repeats, the cost without.

Usage (from the repo root; docs/BENCHMARKS.md has the numbers):
    .venv/bin/python -m benchmarks.cache [--duration 8s] [--concurrency 4] [--rounds 6] [--json out.json]

Two real servers stay up the whole run, both with the default layout and the demo
model: one with the cache on (the default: local LMDB in the run folder), one
with `[cache] enabled = false`. An idle sync worker uses no CPU, so each ratio's
two sides are measured next to each other (this machine drifts by 10 % within
minutes), in the order on, off, off, on, ... over `--rounds`.
  1. hit time: the cat photo POSTed to /predict `--hits` times, one at a time, on
     the cache-on server; the p50 of `Server-Timing` total over the HIT replies
     (target <= 0.5 ms), next to the same for computed replies on the other server;
     then both again with idle CPUs polling (root only: /dev/cpu_dma_latency = 0, as
     tuned's latency-performance profile), so a halted vCPU's wake-up is not counted;
  2. /predict throughput with every request a repeat (what a hit costs under load), then
     with half the requests repeating earlier images (`onnxpool bench --repeat-fraction
     0.5`), cache on vs off (target >= 1.8x), and the same workload against a bare
     gunicorn app (benchmarks/baselines/floor_wsgi.py, same workers, a reply of the
     same size): a hit can cost no less than that app's request, so it gives the
     ratio's ceiling on this machine in the same run;
  3. the same with no repeats at all, every request a new image: what the cache
     costs when it never hits (target <= 3 %).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import requests

from benchmarks.alternating import alternating_rounds, predict_rate
from benchmarks.floor import start_floor_app
from benchmarks.output import emit
from onnxpool.measure.httpbench import parse_seconds
from onnxpool.measure.idle_latency import measured_polling
from onnxpool.measure.paths import CAT_JPEG
from onnxpool.measure.servers import Server, running_server
from onnxpool.workers.cores import plan_layout, usable_cores

JPEG = {"Content-Type": "image/jpeg"}
TOTAL = re.compile(r"total;dur=([0-9.]+)")
LOOKUP = re.compile(r"cache;dur=([0-9.]+);desc=hit")


def server_times(server: Server, image: bytes, count: int) -> dict[str, Any]:
    """POST the image `count` times; Server-Timing total (and the cache's part) in ms, split by X-Cache."""
    totals: dict[str, list[float]] = {"HIT": [], "MISS": [], "none": []}
    lookups: list[float] = []
    with requests.Session() as session:
        for _ in range(count):
            reply = session.post(server.url + "/predict", files={"image": ("cat.jpg", image, "image/jpeg")}, timeout=30)
            reply.raise_for_status()
            timing = reply.headers["Server-Timing"]
            match = TOTAL.search(timing)
            assert match is not None, timing
            totals[reply.headers.get("X-Cache", "none")].append(float(match.group(1)))
            lookup = LOOKUP.search(timing)
            if lookup is not None and reply.headers.get("X-Cache") == "HIT":
                lookups.append(float(lookup.group(1)))

    def pct(values: list[float], q: int) -> float | None:
        return round(statistics.quantiles(values, n=100)[q - 1], 3) if len(values) >= 2 else None

    return {
        kind: {"count": len(values), "p50_ms": pct(values, 50), "p90_ms": pct(values, 90)}
        for kind, values in totals.items()
        if values
    } | ({"cache_part_p50_ms": pct(lookups, 50)} if lookups else {})


def compare(sides: dict[str, Server], fraction: float, args: argparse.Namespace) -> dict[str, list[float]]:
    """Requests/s of each server on the same workload, `--rounds` times, the order reversed every round."""
    measures = {name: partial(predict_rate, server, args, repeat_fraction=fraction) for name, server in sides.items()}
    return alternating_rounds(measures, args.rounds, f"repeat fraction {fraction:g}")


def summary(fraction: float, rates: dict[str, list[float]]) -> dict[str, Any]:
    """Cache on vs off; with the bare app measured too, the ceiling of that ratio on this machine.

    A hit cannot cost less than the bare gunicorn app's request (accept, parse, read the
    body, reply, close) and a miss no less than the cache-off server's request, so at
    this repeat fraction the best a cache can do is 1 / ((1 - f) / off + f / floor).
    """
    mean = {name: statistics.fmean(values) for name, values in rates.items()}
    result: dict[str, Any] = {"repeat_fraction": fraction}
    result |= {f"{name}_rps": [round(r, 1) for r in values] for name, values in rates.items()}
    result["ratio_on_off"] = round(mean["on"] / mean["off"], 3)
    if "floor" in mean:
        best = 1 / ((1 - fraction) / mean["off"] + fraction / mean["floor"])
        result["ceiling_ratio"] = round(best / mean["off"], 3)
        result["share_of_ceiling"] = round(mean["on"] / best, 3)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cache", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=parse_seconds, default=8.0, help="measured seconds per side (8s)")
    parser.add_argument("--warmup", type=parse_seconds, default=3.0, help="warm-up seconds per side (3s)")
    parser.add_argument("--concurrency", type=int, default=4, help="connections (default 4)")
    # more, shorter alternations: this machine drifts 10-15 % between rounds (docs/BENCHMARKS.md)
    parser.add_argument("--rounds", type=int, default=6, help="on/off pairs per workload (default 6)")
    parser.add_argument("--hits", type=int, default=400, help="requests for the hit time (default 400)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    workers = plan_layout(usable_cores(), "auto", "auto").workers
    quiet = {"ONNXPOOL_LOGGING__ACCESS_LOG": "false"}
    with tempfile.TemporaryDirectory(prefix="onnxpool-cache-bench-") as tmp:
        folder = Path(tmp)
        with (
            running_server(folder, quiet, workers=workers, name="cache-on") as on,
            running_server(folder, {**quiet, "ONNXPOOL_CACHE__ENABLED": "false"}, workers=workers, name="off") as off,
        ):
            started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            cat = CAT_JPEG.read_bytes()

            def hit_times() -> dict[str, Any]:
                return {
                    "hit_server_time": server_times(on, cat, args.hits),
                    "computed_server_time": server_times(off, cat, max(50, args.hits // 4)),
                }

            print("hit time ...", file=sys.stderr)
            result: dict[str, Any] = {
                "measured_at": started,
                "workers": workers,
                "concurrency": args.concurrency,
                "duration_s": args.duration,
                **hit_times(),
            }
            # The same again with idle CPUs polling: one request at a time leaves the CPUs
            # idle in between, and on a VM waking a halted vCPU costs the next request more
            # than the cache does (measure/idle_latency.py).
            print("hit time, idle CPUs polling (root only) ...", file=sys.stderr)
            result["idle_polling"] = measured_polling(hit_times)
            print("throughput, every request a repeat (cache on) ...", file=sys.stderr)
            result["all_hits_rps"] = round(predict_rate(on, args, repeat_fraction=1.0), 1)
            reply_bytes = len(requests.post(on.url + "/predict", data=cat, headers=JPEG, timeout=30).content)
            floor = start_floor_app(folder, workers, reply_bytes)
            try:
                print("throughput, half of the requests repeating ...", file=sys.stderr)
                sides = {"on": on, "off": off, "floor": floor}
                result["half_repeats"] = summary(0.5, compare(sides, 0.5, args))
            finally:
                floor.stop()
            print("throughput, no repeats ...", file=sys.stderr)
            result["no_repeats"] = summary(0.0, compare({"on": on, "off": off}, 0.0, args))
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
