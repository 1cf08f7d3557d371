"""Two models on one host: does the text model keep its budget while the image model is flooded?

Usage (needs models/minilm: `make minilm`; docs/BENCHMARKS.md has the numbers):
    .venv/bin/python -m benchmarks.isolation [--duration 10s] [--json out.json]

For each setup, MiniLM (all-MiniLM-L6-v2, /v1/embeddings, one sentence per request, cycling
through benchmarks.text_sentences, response cache off) is measured by a steady client on 2
connections, first alone, then while wrk (Debian's `wrk`: a light C client) floods the image
model's /predict with the cat photo on 8 connections (cache off, `Cache-Control: no-store`).
Both clients are this machine's processes: the load generators share the cores with the servers.
Setups:
  whole-host   two one-model servers, each sized for the whole host (2 workers x 1 thread)
  4+2          the image server with 4 workers, MiniLM with 2
  4+2 renice   the same, the image workers reniced to 10
  1x2          one worker x 2 threads each
  taskset      split by hand: each server pinned to one core (1 worker)
  onnxpool     one host serving both (`onnxpool serve` on a two-model file, budgets 1 + 1 core),
               through its front door (nginx); `[server] budgets` auto (a cgroup here as root),
               then nice values; then the image model with 4 workers (its budget still 1 core)
Goals (issue 29): onnxpool alone >= 0.9x whole-host alone (a single-model server owning the host);
under the flood >= 0.9x the throughput and <= 1.2x the p99 of MiniLM's budget alone (one core:
taskset alone).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.output import emit
from benchmarks.text import workload
from benchmarks.text_sentences import sentences
from onnxpool.measure.httpbench import parse_seconds
from onnxpool.measure.loadgen import LoadGenerator, StepPlan
from onnxpool.measure.paths import CAT_JPEG
from onnxpool.measure.servers import Server, children_of, free_port, start_command, start_server

REPO = Path(__file__).resolve().parents[1]
IMAGE_MODEL = REPO / "models" / "efficientnet-lite0" / "model.onnx"
MINILM = REPO / "models" / "minilm" / "model.onnx"
TEXT_SETTINGS = {"ONNXPOOL_CONFIG": "minilm", "ONNXPOOL_CACHE__ENABLED": "false", "ONNXPOOL_TASK__TRUNCATE": "true"}
IMAGE_SETTINGS = {"ONNXPOOL_CACHE__ENABLED": "false"}
STEADY_CONNECTIONS = 2
FLOOD_CONNECTIONS = 8


@dataclass(frozen=True)
class Row:
    setup: str
    alone_rps: float
    flood_rps: float
    alone_p99_ms: float
    flood_p99_ms: float
    flood_errors: int
    image_rps: float
    image_shed: int


TWO_MODELS = """\
[server]
budgets = "{budgets}"
[cache]
enabled = false
[models.efficientnet-lite0]
path = "{image}"
task = "image-classification"
cpus = 1.0
workers = {image_workers}
[models.all-minilm-l6-v2]
path = "{minilm}"
task = "text-embedding"
cpus = 1.0
[tasks.all-minilm-l6-v2]
truncate = true
"""


@contextlib.contextmanager
def two_servers(logs: Path, image: dict[str, str], text: dict[str, str], **kwargs: Any) -> Iterator[tuple[str, str]]:
    """Two one-model servers (image, MiniLM); yields their URLs. kwargs: cpus_image / cpus_text (taskset)."""
    with ExitStack() as stack:
        servers: list[Server] = []
        for name, settings, cpus in (
            ("image", {**IMAGE_SETTINGS, **image}, kwargs.get("cpus_image")),
            ("minilm", {**TEXT_SETTINGS, **text}, kwargs.get("cpus_text")),
        ):
            workers = int(settings.get("ONNXPOOL_SERVER__WORKERS", "1"))
            server = start_server(logs, settings, workers=workers, name=name, cpus=cpus, timeout=180)
            stack.callback(server.stop)
            servers.append(server)
        if kwargs.get("renice_image"):
            for pid in children_of(servers[0].pid):
                os.setpriority(os.PRIO_PROCESS, pid, 10)
        yield servers[0].url, servers[1].url


@contextlib.contextmanager
def onnxpool_host(logs: Path, budgets: str, image_workers: int = 2) -> Iterator[tuple[str, str]]:
    """`onnxpool serve` on a two-model file (image + MiniLM, one core's budget each); yields the front door twice."""
    settings = logs / f"two-models-{budgets}-{image_workers}.toml"
    text = TWO_MODELS.format(budgets=budgets, image=IMAGE_MODEL, minilm=MINILM, image_workers=image_workers)
    settings.write_text(text, encoding="utf-8")
    port = free_port()
    argv = [str(Path(sys.executable).with_name("onnxpool")), "serve", "--config", str(settings)]
    env = {"ONNXPOOL_SERVER__BIND": f"127.0.0.1:{port}", "PYTHONUNBUFFERED": "1"}
    server = start_command(argv, logs, port, "/v2/health/ready", env=env, name=f"host-{budgets}", timeout=300)
    try:
        yield server.url, server.url
    finally:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(60)
        except Exception:
            server.stop()


WRK_SCRIPT = """\
-- POST /predict with the cat photo as multipart (written by benchmarks/isolation.py)
local file = io.open(os.getenv("ISOLATION_IMAGE"), "rb")
local image = file:read("*a")
file:close()
local boundary = "onnxpool-isolation-boundary"
wrk.method = "POST"
wrk.headers["Content-Type"] = "multipart/form-data; boundary=" .. boundary
wrk.headers["Cache-Control"] = "no-store"
wrk.body = "--" .. boundary .. "\\r\\n"
  .. 'Content-Disposition: form-data; name="image"; filename="cat.jpg"\\r\\n'
  .. "Content-Type: image/jpeg\\r\\n\\r\\n" .. image .. "\\r\\n--" .. boundary .. "--\\r\\n"
"""


@dataclass(frozen=True)
class Flood:
    requests_per_second: float
    failed: int


def wrk_flood(url: str, seconds: float, folder: Path) -> Flood:
    """wrk on /predict at FLOOD_CONNECTIONS connections for `seconds` (one thread: a light client)."""
    script = folder / "flood.lua"
    script.write_text(WRK_SCRIPT, encoding="utf-8")
    argv = ["wrk", "-t1", f"-c{FLOOD_CONNECTIONS}", f"-d{max(1, round(seconds))}s", "-s", str(script), url + "/predict"]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "ISOLATION_IMAGE": str(CAT_JPEG)})
    rate = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    failed = re.search(r"Non-2xx or 3xx responses: (\d+)", done.stdout)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", done.stdout)
    if rate is None:
        raise RuntimeError(f"wrk failed: {done.stdout} {done.stderr}")
    return Flood(
        float(rate.group(1)),
        (int(failed.group(1)) if failed else 0) + (sum(map(int, errors.groups())) if errors else 0),
    )


def measure(image_url: str, text_url: str, args: argparse.Namespace, setup: str, folder: Path) -> Row:
    """MiniLM alone, then under the image flood (wrk)."""
    cycle = workload(sentences(), 1)
    with LoadGenerator(text_url, cycle, STEADY_CONNECTIONS) as steady:
        steady.run_step(StepPlan(STEADY_CONNECTIONS, warmup=0.0, duration=args.warmup))
        alone = steady.run_step(StepPlan(STEADY_CONNECTIONS, warmup=1.0, duration=args.duration))
        flooded: dict[str, Flood] = {}

        def run_flood() -> None:
            flooded["image"] = wrk_flood(image_url, args.duration + args.warmup + 3.0, folder)

        thread = threading.Thread(target=run_flood)
        thread.start()
        under = steady.run_step(StepPlan(STEADY_CONNECTIONS, warmup=args.warmup, duration=args.duration))
        thread.join()
    image = flooded["image"]
    row = Row(
        setup=setup,
        alone_rps=round(alone.throughput, 1),
        flood_rps=round(under.throughput, 1),
        alone_p99_ms=round(alone.percentile(99) * 1000, 1),
        flood_p99_ms=round(under.percentile(99) * 1000, 1),
        flood_errors=under.error_count,
        image_rps=round(image.requests_per_second, 1),
        image_shed=image.failed,
    )
    print(f"  {setup}: {row}", file=sys.stderr, flush=True)
    return row


def setups(logs: Path) -> dict[str, Callable[[], contextlib.AbstractContextManager[tuple[str, str]]]]:
    two = {"ONNXPOOL_SERVER__WORKERS": "2", "ONNXPOOL_SERVER__THREADS_PER_WORKER": "1"}
    four = {"ONNXPOOL_SERVER__WORKERS": "4", "ONNXPOOL_SERVER__THREADS_PER_WORKER": "1"}
    one_by_two = {"ONNXPOOL_SERVER__WORKERS": "1", "ONNXPOOL_SERVER__THREADS_PER_WORKER": "2"}
    one = {"ONNXPOOL_SERVER__WORKERS": "1", "ONNXPOOL_SERVER__THREADS_PER_WORKER": "1"}
    return {
        "each server sized for the whole host (2 workers x 1 thread each)": lambda: two_servers(logs, two, two),
        "image server with 4 workers, MiniLM with 2": lambda: two_servers(logs, four, two),
        "same, the image workers reniced to 10": lambda: two_servers(logs, four, two, renice_image=True),
        "1 worker x 2 threads each": lambda: two_servers(logs, one_by_two, one_by_two),
        "split by hand with taskset, one core each": lambda: two_servers(logs, one, one, cpus_image="0", cpus_text="1"),
        "onnxpool, two models on one host, budgets 1 + 1 core (cgroup weights)": lambda: onnxpool_host(logs, "auto"),
        "onnxpool, two models on one host, budgets 1 + 1 core (nice values)": lambda: onnxpool_host(logs, "nice"),
        "onnxpool, the same with 4 image workers (cgroup weights)": lambda: onnxpool_host(logs, "auto", 4),
        "onnxpool, the same with 4 image workers (nice values)": lambda: onnxpool_host(logs, "nice", 4),
    }


def median_row(setup: str, measured: list[Row]) -> Row:
    """Each number's median over the rounds."""

    def median(field: str) -> float:
        return round(float(statistics.median(float(getattr(row, field)) for row in measured)), 1)

    return Row(
        setup=setup,
        alone_rps=median("alone_rps"),
        flood_rps=median("flood_rps"),
        alone_p99_ms=median("alone_p99_ms"),
        flood_p99_ms=median("flood_p99_ms"),
        flood_errors=sum(row.flood_errors for row in measured),
        image_rps=median("image_rps"),
        image_shed=sum(row.image_shed for row in measured),
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| setup | MiniLM alone | MiniLM under the flood | p99 under flood / alone | image under flood |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.setup} | {row.alone_rps:.1f} req/s | {row.flood_rps:.1f} | "
            f"{row.flood_p99_ms:.1f} / {row.alone_p99_ms:.1f} ms | {row.image_rps:.1f} req/s"
            + (f", {row.image_shed} shed/failed" if row.image_shed else "")
            + " |"
        )
    return "\n".join(lines)


def goals(rows: list[Row]) -> list[str]:
    """The goals for each onnxpool row, against the whole-host and taskset rows of the same run.

    "Its budget alone" is MiniLM on one core of its own (taskset) with nothing else running; the
    same core of its own while the flood runs is the ceiling these load generators leave (they
    run on the same cores, outside any budget)."""
    by_setup = {row.setup: row for row in rows}
    owner = next(row for name, row in by_setup.items() if name.startswith("each server sized"))
    budget = next(row for name, row in by_setup.items() if name.startswith("split by hand"))
    lines = []
    for row in rows:
        if not row.setup.startswith("onnxpool"):
            continue
        lines.append(
            f"{row.setup}: alone {row.alone_rps / owner.alone_rps:.2f}x a one-model server owning the host "
            f"(goal >= 0.9); under the flood {row.flood_rps / budget.alone_rps:.2f}x the throughput "
            f"(goal >= 0.9) and {row.flood_p99_ms / budget.alone_p99_ms:.2f}x the p99 (goal <= 1.2) of its "
            f"budget alone (one core, taskset); {row.flood_rps / budget.flood_rps:.2f}x the throughput and "
            f"{row.flood_p99_ms / budget.flood_p99_ms:.2f}x the p99 of that core of its own under the same flood"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=parse_seconds, default=10.0, help="measured seconds per phase (10s)")
    parser.add_argument("--warmup", type=parse_seconds, default=2.0, help="unmeasured seconds before each (2s)")
    parser.add_argument("--only", help="run only setups whose name contains one of these texts (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each setup, alternating (3)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not MINILM.is_file():
        print(f"{MINILM} is missing: build it with `make minilm`", file=sys.stderr)
        return 1
    per_setup: dict[str, list[Row]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        plans = setups(Path(tmp))
        wanted = [text for text in (args.only or "").split(",") if text]
        chosen = {name: start for name, start in plans.items() if not wanted or any(t in name for t in wanted)}
        # Every setup's servers stay up the whole run (an idle sync worker uses no CPU), so that the
        # setups are measured in alternating rounds and the machine's drift falls on all of them.
        urls = {}
        for index, (name, start) in enumerate(chosen.items(), 1):
            print(f"starting [{index}/{len(chosen)}] {name}", file=sys.stderr, flush=True)
            urls[name] = stack.enter_context(start())
        for round_index in range(args.rounds):
            order = list(chosen) if round_index % 2 == 0 else list(reversed(chosen))
            for index, name in enumerate(order, 1):
                print(
                    f"round {round_index + 1}/{args.rounds} [{index}/{len(order)}] {name}", file=sys.stderr, flush=True
                )
                image_url, text_url = urls[name]
                per_setup.setdefault(name, []).append(measure(image_url, text_url, args, name, Path(tmp)))
    rows = [median_row(name, measured) for name, measured in per_setup.items()]
    print(table(rows))
    for line in goals(rows) if any(r.setup.startswith("split") for r in rows) and len(rows) > 2 else []:
        print(line)
    emit(
        {
            "median": [row.__dict__ for row in rows],
            "rounds": {name: [row.__dict__ for row in measured] for name, measured in per_setup.items()},
            "duration_s": args.duration,
        },
        args.json,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
