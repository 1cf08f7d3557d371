"""gRPC vs v2 REST with binary tensors: the same model, the same tensors, side by side in ONE run.

Starts one onnxpool per model (the image demo model, 1x3x224x224 FP32; iris, 1x4 FP32) with
`[server] grpc_bind` on and the response cache off (every tensor is random, and a repeated one would
be answered from the cache), workers = usable cores. For each concurrency, rounds alternate the two
transports so that drifting machine load hits both alike:

- gRPC: `tritonclient.grpc` ModelInfer (raw_input_contents), one client (channel) per caller;
- REST: `tritonclient.http` v2 infer with binary tensors in and out, one client per caller.

Callers are closed loops (one call in flight each), spread over up to 4 client processes (threads
within each), so that one Python client's GIL is not the ceiling. Reported per cell: answers/s,
p50/p99 latency, and the server's CPU per answer (the utime+stime of the server's processes, read
from /proc before and after: master and workers), the clients' CPU per answer beside it.

    .venv/bin/python -m benchmarks.grpc_rest --seconds 6 --rounds 2 --json grpc.json --plot grpc.png
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.output import emit
from onnxpool.config.loader import DEFAULT_CONFIG_FILE
from onnxpool.measure.servers import MODEL_NAME, Server, children_of, cpu_seconds, free_port, start_server

TRANSPORTS = ("grpc", "rest")
IRIS_CONFIG = DEFAULT_CONFIG_FILE.parent / "iris.toml"


@dataclass(frozen=True)
class Target:
    """A model served for the run: its name, input, and the addresses of both transports."""

    model: str
    input_name: str
    shape: tuple[int, ...]
    rest: str
    grpc: str


@dataclass
class Cell:
    """One model x concurrency x transport, summed over its rounds."""

    answers: int = 0
    failed: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    server_cpu: float = 0.0
    client_cpu: float = 0.0

    def summary(self) -> dict[str, float]:
        ordered = sorted(self.latencies)
        per = max(self.answers, 1)
        return {
            "answers_per_s": self.answers / self.seconds if self.seconds else 0.0,
            "p50_ms": 1000 * ordered[len(ordered) // 2] if ordered else 0.0,
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0,
            "server_cpu_ms_per_answer": 1000 * self.server_cpu / per,
            "client_cpu_ms_per_answer": 1000 * self.client_cpu / per,
            "failed": self.failed,
        }


def _caller(transport: str, target: Target, seed: int, until: float) -> tuple[int, int, list[float]]:
    """One closed-loop caller: its own client, 16 random tensors in turn; (answers, failures, latencies)."""
    rng = np.random.default_rng(seed)
    tensors = [rng.random(target.shape, dtype=np.float32) for _ in range(16)]
    latencies: list[float] = []
    failed = 0
    if transport == "grpc":
        import tritonclient.grpc as client_module

        client: Any = client_module.InferenceServerClient(target.grpc)

        def call(array: np.ndarray) -> None:
            tensor = client_module.InferInput(target.input_name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            client.infer(target.model, [tensor])

    else:
        import tritonclient.http as client_module

        client = client_module.InferenceServerClient(target.rest.removeprefix("http://"))

        def call(array: np.ndarray) -> None:
            tensor = client_module.InferInput(target.input_name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array, binary_data=True)
            client.infer(target.model, [tensor], outputs=None, request_compression_algorithm=None)

    n = 0
    while time.monotonic() < until:
        start = time.perf_counter()
        try:
            call(tensors[n % len(tensors)])
        except Exception:  # counted, not raised: a failure is a result of the run
            failed += 1
        else:
            latencies.append(time.perf_counter() - start)
        n += 1
    client.close()
    return len(latencies), failed, latencies


def _client_process(args: tuple[str, Target, int, int, float]) -> tuple[int, int, list[float], float]:
    """One client process: `threads` callers; what they did and the CPU this process used."""
    transport, target, first_seed, threads, until = args
    used = resource.getrusage(resource.RUSAGE_SELF)
    results: list[tuple[int, int, list[float]]] = []

    def run(seed: int) -> None:
        results.append(_caller(transport, target, seed, until))

    workers = [threading.Thread(target=run, args=(first_seed + k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    answers = sum(r[0] for r in results)
    failed = sum(r[1] for r in results)
    latencies = [x for r in results for x in r[2]]
    return answers, failed, latencies, usage.ru_utime + usage.ru_stime - used.ru_utime - used.ru_stime


def measure(
    transport: str, target: Target, concurrency: int, seconds: float, server: Server, cell: Cell, warmup: float
) -> float:
    """One closed-loop step; adds to `cell`, returns answers/s."""
    processes = min(concurrency, 4)
    per_process = [concurrency // processes + (1 if k < concurrency % processes else 0) for k in range(processes)]
    pids = [server.pid, *children_of(server.pid)]
    context = multiprocessing.get_context("spawn")  # clean clients: no gRPC state crosses a fork
    with context.Pool(processes) as pool:
        if warmup > 0:  # connect and warm the clients up, unmeasured
            until = time.monotonic() + warmup
            pool.map(_client_process, [(transport, target, 1000 + k, 1, until) for k in range(processes)])
        before = cpu_seconds(pids)
        start = time.monotonic()
        until = start + seconds
        jobs = [(transport, target, 100 * k, threads, until) for k, threads in enumerate(per_process)]
        results = pool.map(_client_process, jobs)
        elapsed = time.monotonic() - start
        cell.server_cpu += cpu_seconds(pids) - before
    answers = sum(r[0] for r in results)
    cell.answers += answers
    cell.failed += sum(r[1] for r in results)
    cell.seconds += elapsed
    for r in results:
        cell.latencies.extend(r[2])
    cell.client_cpu += sum(r[3] for r in results)
    return answers / elapsed if elapsed else 0.0


def _start(tmp: Path, name: str, settings: dict[str, str], workers: int, config: Path | None) -> tuple[Server, str]:
    address = f"127.0.0.1:{free_port()}"
    settings = {"ONNXPOOL_SERVER__GRPC_BIND": address, "ONNXPOOL_CACHE__ENABLED": "false", **settings}
    server = start_server(tmp, settings, workers=workers, config=config, name=name)
    deadline = time.monotonic() + 30
    while server.log().count("gRPC: worker pid=") < workers and time.monotonic() < deadline:
        time.sleep(0.1)
    return server, address


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(result["cells"])
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        rows = result["cells"][model]
        levels = sorted(int(c) for c in rows)
        x = np.arange(len(levels))
        for offset, transport in ((-0.2, "grpc"), (0.2, "rest")):
            ax.bar(x + offset, [rows[str(c)][transport]["answers_per_s"] for c in levels], 0.4, label=transport)
        ax.set_xticks(x, [f"c={c}" for c in levels])
        ax.set_title(model)
        ax.set_ylabel("answers/s")
        ax.legend()
    fig.suptitle(f"gRPC vs REST binary, {result['workers']} workers, {result['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per cell and round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--models", nargs="+", default=["image", "iris"], choices=["image", "iris"])
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each step")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--plot", type=Path, default=None, help="a bar chart of answers/s (matplotlib)")
    args = parser.parse_args(argv)

    steps = len(args.models) * len(args.concurrency) * args.rounds * len(TRANSPORTS)
    cells: dict[str, dict[str, dict[str, Cell]]] = {}
    done = 0
    with tempfile.TemporaryDirectory(prefix="onxp-grpc-bench-") as tmp:
        for model in args.models:
            settings = {"ONNXPOOL_SERVER__WORKERS": str(args.workers)}
            config = IRIS_CONFIG if model == "iris" else None
            server, address = _start(Path(tmp), model, settings, args.workers, config)
            try:
                if model == "iris":
                    target = Target("iris", "input", (1, 4), server.url, address)
                else:
                    target = Target(MODEL_NAME, "input", (1, 3, 224, 224), server.url, address)
                table = cells[target.model] = {}
                for concurrency in args.concurrency:
                    row = table[str(concurrency)] = {t: Cell() for t in TRANSPORTS}
                    for round_no in range(args.rounds):
                        order = TRANSPORTS if round_no % 2 == 0 else TRANSPORTS[::-1]
                        for transport in order:
                            rate = measure(
                                transport, target, concurrency, args.seconds, server, row[transport], args.warmup
                            )
                            done += 1
                            print(
                                f"[{done}/{steps}] {target.model} c={concurrency} round {round_no + 1} "
                                f"{transport}: {rate:.1f}/s",
                                file=sys.stderr,
                                flush=True,
                            )
            finally:
                server.stop()

    result: dict[str, Any] = {
        "cpu": _cpu_name(),
        "workers": args.workers,
        "seconds_per_cell_round": args.seconds,
        "rounds": args.rounds,
        "cells": {
            model: {c: {t: cell.summary() for t, cell in row.items()} for c, row in table.items()}
            for model, table in cells.items()
        },
    }
    _print_table(result)
    if args.json is not None:
        emit(result, args.json)
    if args.plot is not None:
        plot(result, args.plot)
    return 0


def _print_table(result: dict[str, Any]) -> None:
    print(f"\ngRPC vs v2 REST binary: {result['cpu']}, {result['workers']} workers, cache off")
    header = f"{'model':<20}{'c':>4}  {'transport':<6}{'answers/s':>10}{'p50 ms':>8}{'p99 ms':>8}"
    print(header + f"{'srv CPU ms':>11}{'cli CPU ms':>11}{'failed':>7}  grpc/rest")
    for model, table in result["cells"].items():
        for concurrency, row in table.items():
            rest = row["rest"]["answers_per_s"]
            for transport, s in row.items():
                ratio = f"{s['answers_per_s'] / rest:.3f}" if transport == "grpc" and rest else ""
                print(
                    f"{model:<20}{concurrency:>4}  {transport:<6}{s['answers_per_s']:>10.1f}{s['p50_ms']:>8.2f}"
                    f"{s['p99_ms']:>8.2f}{s['server_cpu_ms_per_answer']:>11.2f}{s['client_cpu_ms_per_answer']:>11.2f}"
                    f"{s['failed']:>7}  {ratio}"
                )


if __name__ == "__main__":
    raise SystemExit(main())
