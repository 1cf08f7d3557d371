"""What the inference log costs the server, in one run: off, every request to a discarding sink, to files.

Usage (from the repo root; docs/BENCHMARKS.md has the numbers):
    .venv/bin/python -m benchmarks.inference_log [--rounds 3] [--duration 8s] [--json out.json]

Three real servers stay up the whole run, each the demo model with the default layout and the
response cache off (every request computed): `[inference_log]` off; `url` = a CloudEvents sink
that answers 202 and discards (benchmarks.trace_sink, a process of its own: what logging costs
the server, not a consumer), `sample = 1.0`, `mode = "all"`; and `path` = a folder in the run's
temporary folder (JSON lines). Each round measures `/predict` (the cat photo) and v2 infer with
binary tensors at concurrency 1 and 4 on each server, the servers' order reversed every other
round (an idle sync worker uses no CPU, and drift falls on every side alike). Printed: the
median over rounds of answers/s, p50 and p99 per side, and each side's ratio to off.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.ab import REPO, checkout_server, trace_sink
from onnxpool.measure.httpbench import BenchOptions, parse_seconds, run_bench
from onnxpool.measure.paths import CAT_JPEG
from onnxpool.measure.progress import Progress

MODES = ("predict", "v2-binary")
CONCURRENCY = (1, 4)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def measure(url: str, mode: str, concurrency: int, args: argparse.Namespace) -> dict[str, float]:
    options = BenchOptions(
        url=url, mode=mode, concurrency=(concurrency,), warmup=args.warmup, duration=args.duration,  # type: ignore[arg-type]
        image=CAT_JPEG if mode == "predict" else None,
    )  # fmt: skip
    step = run_bench(options, Progress(enabled=False)).steps[0]
    if step.error_count:
        raise RuntimeError(f"{step.error_count} errors: {step.errors}")
    return {"rps": step.throughput, "p50": step.percentile(50) * 1e3, "p99": step.percentile(99) * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=parse_seconds, default=8.0)
    parser.add_argument("--warmup", type=parse_seconds, default=2.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        logs, folder = Path(tmp), Path(tmp) / "inference-log"
        sink = stack.enter_context(trace_sink()) + "/"
        base = {"ONNXPOOL_CACHE__ENABLED": "false"}
        sides = {
            "off": base,
            "sink": {**base, "ONNXPOOL_INFERENCE_LOG__URL": sink},
            "files": {**base, "ONNXPOOL_INFERENCE_LOG__PATH": str(folder)},
        }
        servers = {name: stack.enter_context(checkout_server(REPO, logs, name, env)) for name, env in sides.items()}
        print("servers up; measuring", file=sys.stderr)
        for round_ in range(args.rounds):
            order = list(servers) if round_ % 2 == 0 else list(reversed(list(servers)))
            for mode in MODES:
                for concurrency in CONCURRENCY:
                    key = f"{mode} c={concurrency}"
                    for name in order:
                        found = measure(servers[name].url, mode, concurrency, args)
                        results.setdefault(key, {}).setdefault(name, []).append(found)
                        print(f"  round {round_ + 1}, {key}, {name}: {found['rps']:.1f}/s p50 {found['p50']:.2f} "
                              f"p99 {found['p99']:.2f} ms", file=sys.stderr)  # fmt: skip
        written = sum(p.stat().st_size for p in folder.glob("*.jsonl"))
    print(f"CPU: {cpu_name()}; {args.rounds} rounds of {args.duration:g} s; files written: {written / 2**20:.1f} MiB")
    header = "| | off answers/s | sink | files | sink/off | files/off"
    print(header + " | p50 ms off / sink / files | p99 ms off / sink / files |")
    print("|---|---|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for key, by_side in results.items():
        med = {side: {m: statistics.median(r[m] for r in runs) for m in ("rps", "p50", "p99")}
               for side, runs in by_side.items()}  # fmt: skip
        summary[key] = med
        off, on, files = med["off"], med["sink"], med["files"]
        print(
            f"| {key} | {off['rps']:.1f} | {on['rps']:.1f} | {files['rps']:.1f} | {on['rps'] / off['rps']:.3f} | "
            f"{files['rps'] / off['rps']:.3f} | {off['p50']:.2f} / {on['p50']:.2f} / {files['p50']:.2f} | "
            f"{off['p99']:.2f} / {on['p99']:.2f} / {files['p99']:.2f} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"cpu": cpu_name(), "results": results, "medians": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
