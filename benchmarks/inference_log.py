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

`--faults` adds two sides: a sink that answers each POST 2 s late, and one that is down (nothing
listens): requests must not notice either; their workers' memory at the start and the end, and
the events sent, dropped and failed, are printed after the table.
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

import requests
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.ab import REPO, checkout_server, trace_sink
from onnxpool.measure.httpbench import BenchOptions, parse_seconds, run_bench
from onnxpool.measure.paths import CAT_JPEG
from onnxpool.measure.progress import Progress
from onnxpool.measure.servers import Server, free_port, proc_status

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


def ratio(value: float, base: float) -> str:
    return f"{value / base:.3f}" if base else "-"


def log_counts(url: str) -> dict[str, float]:
    """The server's onnxpool_inference_log_events_total by outcome (empty when the log is off)."""
    text = requests.get(url + "/metrics", timeout=10).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "onnxpool_inference_log_events":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["outcome"]] = counts.get(sample.labels["outcome"], 0) + sample.value
    return counts


def worker_rss(server: Server) -> list[float]:
    """Each worker's resident memory, MiB."""
    return [int(proc_status(pid)["VmRSS"].split()[0]) / 1024 for pid in server.workers()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=parse_seconds, default=8.0)
    parser.add_argument("--warmup", type=parse_seconds, default=2.0)
    parser.add_argument("--faults", action="store_true", help="also a sink 2 s per POST, and one that is down")
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
        if args.faults:
            slow = stack.enter_context(trace_sink(delay=2.0)) + "/"
            sides["slow"] = {**base, "ONNXPOOL_INFERENCE_LOG__URL": slow}
            sides["down"] = {**base, "ONNXPOOL_INFERENCE_LOG__URL": f"http://127.0.0.1:{free_port()}/"}
        servers = {name: stack.enter_context(checkout_server(REPO, logs, name, env)) for name, env in sides.items()}
        rss_start = {name: worker_rss(server) for name, server in servers.items()}
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
        rss_end = {name: worker_rss(server) for name, server in servers.items()}
        counts = {name: log_counts(server.url) for name, server in servers.items()}
        written = sum(p.stat().st_size for p in folder.glob("*.jsonl"))
    print(f"CPU: {cpu_name()}; {args.rounds} rounds of {args.duration:g} s; files written: {written / 2**20:.1f} MiB")
    print("| | side | answers/s | / off | p50 ms | / off | p99 ms | / off |")
    print("|---|---|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for key, by_side in results.items():
        med = {side: {m: statistics.median(r[m] for r in runs) for m in ("rps", "p50", "p99")}
               for side, runs in by_side.items()}  # fmt: skip
        summary[key] = med
        off = med["off"]
        for side in servers:
            m = med[side]
            print(
                f"| {key} | {side} | {m['rps']:.1f} | {ratio(m['rps'], off['rps'])} | {m['p50']:.2f} | "
                f"{ratio(m['p50'], off['p50'])} | {m['p99']:.2f} | {ratio(m['p99'], off['p99'])} |"
            )
    for side in servers:
        start = ", ".join(f"{v:.0f}" for v in rss_start[side])
        end = ", ".join(f"{v:.0f}" for v in rss_end[side])
        print(f"{side}: worker RSS MiB at start {start}, at the end {end}; events {counts[side] or 'none (off)'}")
    if args.json is not None:
        document = {"cpu": cpu_name(), "results": results, "medians": summary, "counts": counts,
                    "rss_start": rss_start, "rss_end": rss_end}  # fmt: skip
        args.json.write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
