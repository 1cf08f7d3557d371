"""Issue 44 in one run: wide runs (a lone request on every idle core) against main before them and two FastAPI peers.

Usage (from the repo root; docs/BENCHMARKS.md, "A lone request gets every idle core", has the numbers):
    git worktree add --detach /tmp/onnxpool-old <main before wide runs> && make -C /tmp/onnxpool-old install
    cp -r models/minilm /tmp/onnxpool-old/models/          # both checkouts serve MiniLM (make minilm)
    .venv/bin/pip install -e '.[bench,baseline]' --config-settings editable_mode=strict
    .venv/bin/python -m benchmarks.wide --old /tmp/onnxpool-old --duration 6s --warmup 1s \\
        --json wide.json --plot docs/wide

Four servers per workload, all started first and kept up (an idle sync worker or uvicorn worker
uses no CPU), each cell measured next to the others, the servers' order reversed every other
round (benchmarks/alternating.py: this machine drifts 10-25 % within minutes):
  - onnxpool: this checkout, default layout (one pinned worker per core, `[model] wide_threads`
    "auto"), response cache off;
  - main: the `--old` checkout, the same settings (`benchmarks.ab.checkout_server`);
  - fastapi-2w: FastAPI + `uvicorn --workers N` (N = usable cores), a default onnxruntime session
    per worker, `async def` routes (benchmarks/baselines/fastapi_app.py);
  - fastapi-1p: FastAPI in one process, the same default session run in FastAPI's thread pool
    (benchmarks/baselines/fastapi_threadpool.py).
Workloads: `/predict` with the cat photo; `/v1/embeddings` on MiniLM with one short sentence per
request (benchmarks.text_sentences in a fixed shuffled order, `spread_sentences`; cut at 256
tokens) and with one 254-token input per request.
At each concurrency (closed loop, keep-alive connections, onnxpool.measure.loadgen): a drained
warm-up, then a lead-in and the window. Per cell: answers/s, p50, p99 and the server's CPU per answer
(its processes' utime + stime from /proc: unlike answers/s it does not move with the scheduler); for onnxpool also the
share of its inferences that ran wide (its /metrics before and after the cell). The full run is
cells x (warm-up + lead-in + duration): 48 cells at the defaults, about 6.5 minutes plus the starts.

Two sides of one round are measured seconds apart, rounds minutes apart: the table's "paired"
ratio is the geometric mean of the per-round ratios to main, with a 95 % interval
(benchmarks.alternating.paired_ratio). This machine's answers/s still move 5-10 % between two
cells of one round. `--together` loads onnxpool and main at the same time instead, each with its
own generator: the kernel shares the cores between the two servers' sessions, whatever slows the
machine slows both, and the ratio says within about 1 % what an answer costs one against the
other (the quantity per-request work moves); it is not a throughput of either alone.
`--servers` picks some of the four, `--new-env KEY=VALUE` sets this checkout's server only
(`ONNXPOOL_MODEL__WIDE_THREADS=off`: what the wide session and its marks cost).
"""

from __future__ import annotations

import argparse
import platform
import random
import re
import statistics
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests

from benchmarks import REPO
from benchmarks.ab import checkout_server
from benchmarks.alternating import PairedRatio, paired_ratio
from benchmarks.compare import start_baseline
from benchmarks.output import emit
from benchmarks.text import workload
from benchmarks.text_sentences import sentences
from onnxpool.measure.cycle import RequestCycle
from onnxpool.measure.httpbench import parse_seconds, parse_steps
from onnxpool.measure.loadgen import LoadGenerator, StepPlan, StepResult
from onnxpool.measure.paths import CAT_JPEG
from onnxpool.measure.payloads import predict_request
from onnxpool.measure.servers import Server, cpu_seconds
from onnxpool.workers.cores import usable_cores
from onnxpool.workers.cpu_fit import cpu_flags

MINILM = REPO / "models" / "minilm"
LONG_TOKENS = 254
"""With [CLS] and [SEP], 256: MiniLM's limit, so no server cuts it."""
SHUFFLE_SEED = 44
SERVERS = ("onnxpool", "main", "fastapi-2w", "fastapi-1p")
WORKLOADS = ("predict", "embeddings-short", "embeddings-256")


@dataclass(frozen=True)
class Cell:
    """One server at one concurrency on one workload, one round."""

    workload: str
    server: str
    concurrency: int
    round: int
    answers_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    server_cpu_ms: float = 0.0
    """The server's CPU (master and workers, utime + stime from /proc) per answer in the cell's window."""
    wide_share: float | None = None
    """onnxpool only: the share of its inferences in the cell that ran wide."""


def long_inputs(count: int = 16) -> list[str]:
    """`count` texts of exactly LONG_TOKENS tokens each (MiniLM's tokenizer), from the sentences' words."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    tokenizer.no_truncation()
    words = " ".join(s for s in sentences() if s.isascii()).split()
    texts = []
    for start in range(count):
        chosen = words[start * 7 :] + words
        ids = tokenizer.encode(" ".join(chosen[: LONG_TOKENS * 2]), add_special_tokens=False).ids[:LONG_TOKENS]
        texts.append(tokenizer.decode(ids))
    return texts


def spread_sentences() -> list[str]:
    """The 240 sentences in a fixed shuffled order: its long texts (14 of 40-400 words) are spread over the cycle.

    In their own order the long texts sit together (180-193), and a connection does fewer than
    240 requests in a 6 s window: whether a window held that block or not moved a cell's
    answers/s by up to 1.4x (server CPU 6.2 to 9.0 ms per answer in one run, main alone), far
    more than the change under test. Spread out, every window has about the same mix.
    """
    order = sentences()
    random.Random(SHUFFLE_SEED).shuffle(order)
    return order


def cycles() -> dict[str, RequestCycle]:
    return {
        "predict": RequestCycle((predict_request(CAT_JPEG, 1),)),
        "embeddings-short": workload(spread_sentences(), 1),
        "embeddings-256": workload(long_inputs(), 1),
    }


def wide_counts(server: Server) -> tuple[float, float]:
    """onnxpool's wide runs and inferences so far (its /metrics)."""
    text = requests.get(server.url + "/metrics", timeout=10).text

    def total(pattern: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{pattern}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE))

    return total("onnxpool_wide_runs_total"), total("onnxpool_inference_batch_size_count")


def measure_cell(
    server: Server, cycle: RequestCycle, concurrency: int, args: argparse.Namespace
) -> tuple[StepResult, float]:
    """A drained warm-up, then a lead-in and the window (as benchmarks/text.py's `measure_once`).

    Also the server's CPU seconds over the lead-in and the window: throughput on 2 cores shared
    with the load generator moves with the scheduler, what each answer costs the server does not.
    """
    with LoadGenerator(server.url, cycle, concurrency) as generator:
        generator.run_step(StepPlan(concurrency, warmup=0.0, duration=args.warmup))
        pids = [server.pid, *server.workers()]
        before = cpu_seconds(pids)
        step = generator.run_step(StepPlan(concurrency, warmup=args.lead_in, duration=args.duration))
        return step, cpu_seconds(pids) - before


def run_cell(
    name: str, server: Server, cycle: RequestCycle, key: tuple[str, int, int], args: argparse.Namespace
) -> Cell:
    workload_name, concurrency, round_ = key
    before = wide_counts(server) if name == "onnxpool" else None
    step, server_cpu = measure_cell(server, cycle, concurrency, args)
    share = None
    if before is not None:
        after = wide_counts(server)
        runs = after[1] - before[1]
        share = (after[0] - before[0]) / runs if runs else None
    answered = step.latencies.size > 0
    p50, p99 = (step.percentile(50) * 1000, step.percentile(99) * 1000) if answered else (0.0, 0.0)
    # The CPU was read over the lead-in and the window: per answer at the window's rate over both.
    answers = step.items_per_second * (args.lead_in + args.duration)
    cpu_ms = server_cpu / answers * 1000 if answers else 0.0
    return Cell(
        workload_name, name, concurrency, round_, step.items_per_second, p50, p99, step.error_count, cpu_ms, share
    )


def measure_round(
    up: dict[str, Server], cycle: RequestCycle, key: tuple[str, int, int], args: argparse.Namespace
) -> list[Cell]:
    """Every server once: one after another (the order reversed every other round), or with `--together` at once.

    At once, each server under its own load generator and in its own session, the kernel shares
    the cores between them (autogroup), and whatever the machine does in those seconds (a
    neighbour's steal, a slower clock) falls on both alike: their answers/s then differ by what
    an answer costs each, the quantity a change of per-request work moves.
    """
    if not args.together:
        order = list(up) if key[2] % 2 == 0 else list(reversed(list(up)))
        return [run_cell(name, up[name], cycle, key, args) for name in order]
    with ThreadPoolExecutor(len(up)) as pool:
        futures = [pool.submit(run_cell, name, server, cycle, key, args) for name, server in up.items()]
        return [future.result() for future in futures]


def summarise(cells: list[Cell]) -> dict[str, Any]:
    """Medians over rounds per workload, server and concurrency; onnxpool's ratios to main and the c=1 p50s."""
    summary: dict[str, Any] = {}
    for workload_name in WORKLOADS:
        per_server: dict[str, list[dict[str, Any]]] = {}
        for name in SERVERS:
            rows = []
            for c in sorted({cell.concurrency for cell in cells}):
                mine = [x for x in cells if (x.workload, x.server, x.concurrency) == (workload_name, name, c)]
                if not mine:
                    continue
                shares = [x.wide_share for x in mine if x.wide_share is not None]
                paired = _paired_with_main(cells, workload_name, name, c)
                rows.append(
                    {
                        "concurrency": c,
                        "items_per_s": statistics.median(x.answers_per_s for x in mine),
                        "p50_ms": statistics.median(x.p50_ms for x in mine),
                        "p99_ms": statistics.median(x.p99_ms for x in mine),
                        "errors": sum(x.errors for x in mine),
                        "server_cpu_ms": statistics.median(x.server_cpu_ms for x in mine),
                        "wide_share": statistics.median(shares) if shares else None,
                        "vs_main_paired": None
                        if paired is None
                        else {"ratio": paired.ratio, "ci95": [paired.low, paired.high], "rounds": paired.rounds},
                    }
                )
            if rows:
                per_server[name] = rows
        if per_server:
            summary[workload_name] = per_server
    return summary


def _paired_with_main(cells: list[Cell], workload_name: str, name: str, concurrency: int) -> PairedRatio | None:
    """`name` over main, round by round (a round's two cells are seconds apart; rounds are minutes apart)."""
    if name == "main":
        return None
    by_round: dict[int, dict[str, float]] = {}
    for x in cells:
        if (x.workload, x.concurrency) == (workload_name, concurrency) and x.server in (name, "main"):
            by_round.setdefault(x.round, {})[x.server] = x.answers_per_s
    both = [r for r in by_round.values() if name in r and "main" in r]
    return paired_ratio([r[name] for r in both], [r["main"] for r in both]) if both else None


def table(summary: dict[str, Any]) -> str:
    """Markdown: a row per server and concurrency, answers/s, p50, p99, and onnxpool's ratio to main."""
    lines = []
    for workload_name, per_server in summary.items():
        main = {r["concurrency"]: r for r in per_server.get("main", [])}
        lines += [
            f"\n{workload_name}\n",
            "| server | c | answers/s | p50 ms | p99 ms | vs main (medians) | vs main, paired by round (95 %) "
            "| server CPU ms/answer (vs main) | wide share |",
        ]
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for name, rows in per_server.items():
            for r in rows:
                base = main.get(r["concurrency"])
                ratio = f"{r['items_per_s'] / base['items_per_s']:.2f}x" if base and base["items_per_s"] else "-"
                share = f"{r['wide_share']:.2f}" if r["wide_share"] is not None else "-"
                cpu_ms = f"{r['server_cpu_ms']:.2f}"
                if base and base["server_cpu_ms"]:
                    cpu_ms += f" ({r['server_cpu_ms'] / base['server_cpu_ms']:.3f}x)"
                paired = r["vs_main_paired"]
                if paired is None:
                    paired_text = "-"
                elif paired["rounds"] < 2:
                    paired_text = f"{paired['ratio']:.3f}x"
                else:
                    paired_text = f"{paired['ratio']:.3f}x ({paired['ci95'][0]:.3f}-{paired['ci95'][1]:.3f})"
                lines.append(
                    f"| {name} | {r['concurrency']} | {r['items_per_s']:.1f} | {r['p50_ms']:.1f} | "
                    f"{r['p99_ms']:.1f} | {ratio} | {paired_text} | {cpu_ms} | {share} |"
                )
    return "\n".join(lines)


def cpu() -> dict[str, Any]:
    """What the numbers depend on: the CPU's name, its vector flags, the usable cores."""
    names = re.findall(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
    flags = cpu_flags()
    vector = sorted(f for f in flags if f in {"avx2", "fma"} or f.startswith(("avx512", "amx")))
    return {"model": names[0] if names else platform.processor(), "flags": vector, "cores": len(usable_cores())}


def servers(
    old: Path, logs: Path, chosen: set[str], new_env: dict[str, str]
) -> Iterator[tuple[str, dict[str, Server]]]:
    """Per workload kind (image, text): the chosen servers, started and kept up; the image ones stop before text."""
    image = {"ONNXPOOL_CACHE__ENABLED": "false"}
    text = {**image, "ONNXPOOL_CONFIG": "minilm", "ONNXPOOL_TASK__TRUNCATE": "true"}
    peers = {"BASELINE_TEXT_MODEL": str(MINILM / "model.onnx")}
    for kind, settings in (("image", image), ("text", text)):
        with ExitStack() as inner:
            started: dict[str, Server] = {}
            for name, path in (("onnxpool", REPO), ("main", old)):
                if name in chosen:
                    mine = {**settings, **new_env} if name == "onnxpool" else settings
                    started[name] = inner.enter_context(checkout_server(path, logs, f"{name}-{kind}", mine))
            if "fastapi-2w" in chosen:
                started["fastapi-2w"] = start_baseline(logs, len(usable_cores()), env=peers, name=f"fastapi-2w-{kind}")
                inner.callback(started["fastapi-2w"].stop)
            if "fastapi-1p" in chosen:
                started["fastapi-1p"] = start_baseline(
                    logs, None, app="benchmarks.baselines.fastapi_threadpool:app", env=peers, name=f"fastapi-1p-{kind}"
                )
                inner.callback(started["fastapi-1p"].stop)
            yield kind, started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="main before wide runs: a checkout with its .venv")
    parser.add_argument("--concurrency", type=parse_steps, default=(1, 2, 4, 8), help="e.g. 1,2,4,8")
    parser.add_argument("--duration", type=parse_seconds, default=6.0, help="measured window per cell")
    parser.add_argument("--warmup", type=parse_seconds, default=1.0, help="drained warm-up per cell")
    parser.add_argument("--lead-in", type=parse_seconds, default=1.0, help="load before the window opens")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"some of {','.join(WORKLOADS)}")
    parser.add_argument("--servers", default=",".join(SERVERS), help=f"some of {','.join(SERVERS)}")
    parser.add_argument(
        "--together", action="store_true", help="load the servers at the same time, each with its own generator"
    )
    parser.add_argument(
        "--new-env", action="append", default=[], metavar="KEY=VALUE", help="a setting of this checkout's server only"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path, help="PREFIX: a PNG per workload, PREFIX-<workload>.png")
    args = parser.parse_args(argv)
    if not (MINILM / "model.onnx").is_file() or not (args.old / "models" / "minilm" / "model.onnx").is_file():
        raise SystemExit("both checkouts need models/minilm (make minilm; copy the folder into --old)")
    chosen = [w for w in args.workloads.split(",") if w]
    requests_of = cycles()
    kinds = {"predict": "image", "embeddings-short": "text", "embeddings-256": "text"}
    chosen_servers = {name for name in args.servers.split(",") if name}
    if unknown := chosen_servers - set(SERVERS):
        raise SystemExit(f"--servers: unknown {', '.join(sorted(unknown))} (some of {','.join(SERVERS)})")
    total = len(chosen) * len(args.concurrency) * args.rounds * len(chosen_servers)
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory() as tmp:
        new_env = dict(item.split("=", 1) for item in args.new_env)
        for kind, up in servers(args.old.resolve(), Path(tmp), chosen_servers, new_env):
            for workload_name in (w for w in chosen if kinds[w] == kind):
                for concurrency in args.concurrency:
                    for round_ in range(args.rounds):
                        key = (workload_name, concurrency, round_)
                        for cell in measure_round(up, requests_of[workload_name], key, args):
                            cells.append(cell)
                            _progress(len(cells), total, cell)
    summary = summarise(cells)
    print(table(summary), file=sys.stderr)
    if args.plot is not None:
        from onnxpool.measure.plot import plot_series

        for workload_name, per_server in summary.items():
            path = args.plot.with_name(f"{args.plot.name}-{workload_name}.png")
            plot_series(path, per_server, title=f"{workload_name}: wide runs vs main and FastAPI")
    head = {
        "cpu": cpu(),
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "rounds": args.rounds,
        "together": args.together,
        "new_env": args.new_env,
    }
    emit({**head, "summary": summary, "cells": [asdict(c) for c in cells]}, args.json)
    return 0


def _progress(done: int, total: int, cell: Cell) -> None:
    share = f", wide {cell.wide_share:.0%}" if cell.wide_share is not None else ""
    print(
        f"[{done}/{total}] {cell.workload} c={cell.concurrency} {cell.server}: {cell.answers_per_s:.1f}/s, "
        f"p50 {cell.p50_ms:.1f} ms, p99 {cell.p99_ms:.1f} ms, server CPU {cell.server_cpu_ms:.2f} ms/answer{share}"
        + (f", {cell.errors} errors" if cell.errors else ""),
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
