"""This checkout against another one (an older commit), side by side in one run: no regression?

Usage (from the repo root; docs/BENCHMARKS.md has the numbers):
    git worktree add /tmp/onnxpool-old <commit> && make -C /tmp/onnxpool-old install
    .venv/bin/python -m benchmarks.ab --old /tmp/onnxpool-old [--rounds 6] [--duration 8s] [--json out.json]

Four real servers stay up the whole run, each with the default layout and the demo model,
each started by its own checkout's venv and `gunicorn.conf.py`: old and new with the
response cache off (for throughput), old and new with it on (for the hit time). An idle
sync worker uses no CPU, so the sides are measured in alternating rounds (old, new, new,
old, ...), and drift falls on both alike:
  1. /predict req/s with the cat photo at `--concurrency` connections, every request
     computed (cache off);
  2. a cache hit's server time: the cat photo POSTed `--hits` times, one at a time; the p50
     of the `Server-Timing` total over the HIT replies;
  3. with `--embeddings` (both checkouts need models/minilm: `make minilm`), two more servers
     (`--config minilm`, cache off): /v1/embeddings sentences/s at `--concurrency`
     connections, one sentence per request, cycling through benchmarks.text_sentences.
The result is each side's median and the new/old ratio of medians (1.00 = no change).

`--new-env KEY=VALUE` sets a setting of the new side's servers only, and `--trace-sink` points
the new side's `[tracing] endpoint` at an OTLP endpoint that discards (benchmarks.trace_sink):
the same checkout on both sides then measures what a setting costs (`--old .`: tracing on at
ratio 1.0 against off).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path

from benchmarks.alternating import alternating_rounds, old_and_new, predict_rate
from benchmarks.cache import server_times
from benchmarks.output import emit
from benchmarks.text import workload
from benchmarks.text_sentences import sentences
from onnxpool.measure.httpbench import parse_seconds
from onnxpool.measure.loadgen import LoadGenerator, StepPlan
from onnxpool.measure.paths import CAT_JPEG
from onnxpool.measure.servers import Server, free_port, start_command

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def checkout_server(checkout: Path, log_dir: Path, name: str, settings: dict[str, str]) -> Iterator[Server]:
    """gunicorn from `checkout`'s own venv and configuration, on a free loopback port."""
    python = checkout / ".venv" / "bin" / "python"
    if not python.is_file():
        raise SystemExit(f"{checkout} has no .venv (run `make install` there first)")
    port = free_port()
    env = {"ONNXPOOL_SERVER__BIND": f"127.0.0.1:{port}", "PYTHONUNBUFFERED": "1", **settings}
    argv = [str(python), "-m", "gunicorn", "-c", str(checkout / "gunicorn.conf.py")]
    server = start_command(argv, log_dir, port, "/v2/health/ready", env=env, name=name, cwd=checkout)
    try:
        server.wait_ready(2)  # every worker warmed up, not just the first
        yield server
    finally:
        server.stop()


def hit_p50(server: Server, image: bytes, hits: int) -> float:
    times = server_times(server, image, hits + 1)  # the first is the miss that stores it
    value = times["HIT"]["p50_ms"]
    assert isinstance(value, float)
    return value


def embeddings_rate(generator: LoadGenerator, args: argparse.Namespace) -> float:
    """Sentences/s of /v1/embeddings at `args.concurrency` connections (warm-up drained first)."""
    generator.run_step(StepPlan(args.concurrency, warmup=0.0, duration=args.warmup))
    step = generator.run_step(StepPlan(args.concurrency, warmup=1.0, duration=args.duration))
    if step.error_count:
        raise RuntimeError(f"{step.error_count} errors in /v1/embeddings")
    return step.items_per_second


@contextmanager
def trace_sink(delay: float = 0.0) -> Iterator[str]:
    """benchmarks.trace_sink on a free loopback port, in a process of its own (each answer `delay` s late)."""
    port = free_port()
    argv = [sys.executable, "-m", "benchmarks.trace_sink", "--port", str(port), "--delay", str(delay)]
    sink = subprocess.Popen(argv, cwd=REPO)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline or sink.poll() is not None:
                raise RuntimeError("the trace sink did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        sink.terminate()
        sink.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="the other checkout (with its own .venv)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--duration", type=parse_seconds, default=8.0)
    parser.add_argument("--warmup", type=parse_seconds, default=2.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--hits", type=int, default=300)
    parser.add_argument("--embeddings", action="store_true", help="also /v1/embeddings on MiniLM (make minilm)")
    parser.add_argument("--new-env", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting (ONNXPOOL_...) of the new side's servers only")  # fmt: skip
    parser.add_argument("--trace-sink", action="store_true", help="the new side traces to a discarding endpoint")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    image = CAT_JPEG.read_bytes()
    sides = {"old": args.old.resolve(), "new": REPO}
    extra = {"old": {}, "new": dict(item.split("=", 1) for item in args.new_env)}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        logs = Path(tmp)
        if args.trace_sink:
            extra["new"]["ONNXPOOL_TRACING__ENDPOINT"] = stack.enter_context(trace_sink())

        def settings(name: str, base: dict[str, str]) -> dict[str, str]:
            return {**base, **extra[name]}

        off = {
            name: stack.enter_context(
                checkout_server(path, logs, f"{name}-off", settings(name, {"ONNXPOOL_CACHE__ENABLED": "false"}))
            )
            for name, path in sides.items()
        }
        on = {
            name: stack.enter_context(checkout_server(path, logs, f"{name}-on", settings(name, {})))
            for name, path in sides.items()
        }
        print("servers up; measuring", file=sys.stderr)
        rates = alternating_rounds(
            {name: partial(predict_rate, server, args) for name, server in off.items()}, args.rounds, "/predict req/s"
        )
        hits = alternating_rounds(
            {name: partial(hit_p50, server, image, args.hits) for name, server in on.items()}, args.rounds, "hit p50 ms"
        )
        measured = [("predict_req_s", rates), ("hit_p50_ms", hits)]
        if args.embeddings:
            for server in (*off.values(), *on.values()):
                server.stop()  # the image servers' idle workers would still hold memory and sockets
            # truncate: a few of the sentences are longer than the model takes (a 400 otherwise)
            text = {"ONNXPOOL_CONFIG": "minilm", "ONNXPOOL_CACHE__ENABLED": "false", "ONNXPOOL_TASK__TRUNCATE": "true"}
            cycle = workload(sentences(), 1)
            generators = {}
            for name, path in sides.items():
                server = stack.enter_context(checkout_server(path, logs, f"{name}-minilm", settings(name, text)))
                generators[name] = stack.enter_context(LoadGenerator(server.url, cycle, args.concurrency))
            embedded = alternating_rounds(
                {name: partial(embeddings_rate, generator, args) for name, generator in generators.items()},
                args.rounds,
                "/v1/embeddings sentences/s",
            )
            measured.append(("embeddings_sentences_s", embedded))
    result = old_and_new(measured, rounds=args.rounds, duration_s=args.duration, concurrency=args.concurrency)
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
