"""Memory per worker, today's copy vs the mapped copy, in one run (issue 30).

For the image model (FP32 and INT8) and MiniLM (FP32 and INT8), three forms of the served model:

- `copy`: every worker reads a byte copy of the model into its own memory (`[model]
  share_weights = false`), and the arena as before this change (text models: released
  after every run; image models: kept);
- `mapped`: the defaults: the preflight writes onnxruntime's optimised form with its
  weights and prepacked weights in one data file every worker maps; the arena is kept and
  given back past `memory_headroom_mb`;
- `mapped, no prepacking`: the same with `[model] prepacking = false`.

Two measurements:

1. memory: one server at a time (so no other server's workers share its libraries), at 2
   and 4 workers: after warm-up and 20 computed requests (cache off), each worker's
   private and PSS bytes from /proc/<pid>/smaps_rollup, and the master's PSS;
2. speed and high-water: the three servers of a model up side by side with 2 workers, then
   `--rounds` rounds of `--seconds` each at 4 connections, every form in each round, the
   order reversed every other round (alternating A/B: the machine's drift falls on every
   form alike). Text models get the mixed-length load (`mixed_length_requests`: 1, 2, 8
   or 32 inputs of 1-120 words), image models /predict with the cat photo. Each worker's
   RSS is sampled every 0.25 s: its high-water over all rounds minus its RSS before the
   first round. req/s are per-round ratios to `copy`, medians.

Run from a checkout: `python -m benchmarks.memory` (needs models/minilm: `make minilm
minilm-int8`; `--models` picks some). Prints the table (markdown) and the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson
import requests

from benchmarks.alternating import alternating_rounds
from benchmarks.output import emit
from benchmarks.text_sentences import WORDS
from benchmarks.text_targets import sampled
from onnxpool.measure.cycle import RequestCycle
from onnxpool.measure.loadgen import LoadGenerator, StepPlan, Workload
from onnxpool.measure.paths import CAT_JPEG
from onnxpool.measure.payloads import BYPASS_CACHE, PreparedRequest, predict_request
from onnxpool.measure.servers import Server, start_server
from onnxpool.workers.cpu_fit import cpu_flags
from onnxpool.workers.memory import MB, read_memory

REPO = Path(__file__).resolve().parents[1]
EMBEDDINGS = "/v1/embeddings"


@dataclass(frozen=True)
class Model:
    name: str
    config: Path
    served_name: str
    text: bool


MODELS = {
    "image": Model("EfficientNet-Lite0 FP32", REPO / "config" / "onnxpool.toml", "efficientnet-lite0", False),
    "image-int8": Model(
        "EfficientNet-Lite0 INT8", REPO / "config" / "efficientnet-lite0-int8.toml", "efficientnet-lite0-int8", False
    ),
    "minilm": Model("MiniLM FP32", REPO / "config" / "minilm.toml", "all-minilm-l6-v2", True),
    "minilm-int8": Model("MiniLM INT8", REPO / "config" / "minilm-int8.toml", "all-minilm-l6-v2-int8", True),
}


def forms(model: Model) -> dict[str, dict[str, str]]:
    """The settings of each form (ONNXPOOL_* overrides)."""
    before = "release" if model.text else "keep"  # what memory_arena "auto" did before this change
    return {
        "copy": {"ONNXPOOL_MODEL__SHARE_WEIGHTS": "false", "ONNXPOOL_MODEL__MEMORY_ARENA": before},
        "mapped": {},
        "mapped, no prepacking": {"ONNXPOOL_MODEL__PREPACKING": "false"},
    }


def common_settings(model: Model, workers: int) -> dict[str, str]:
    settings = {
        "ONNXPOOL_SERVER__WORKERS": str(workers),
        "ONNXPOOL_CACHE__ENABLED": "false",  # every request computed
        "ONNXPOOL_LOGGING__ACCESS_LOG": "false",
    }
    if model.text:
        settings["ONNXPOOL_TASK__TRUNCATE"] = "true"
    return settings


def mixed_length_requests(model: str, seed: int = 30, count: int = 64) -> RequestCycle:
    """Embeddings requests of 1, 2, 8 or 32 inputs of 1-120 words each (seeded: the same every run)."""
    rng = random.Random(seed)
    requests_: list[PreparedRequest] = []
    for _ in range(count):
        size = rng.choice((1, 2, 8, 32))
        texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 120))) for _ in range(size)]
        body = orjson.dumps({"model": model, "input": texts})
        headers = {"Content-Type": "application/json"}
        requests_.append(PreparedRequest("POST", EMBEDDINGS, body, headers, items=size))
    return RequestCycle(tuple(requests_))


def warm(server: Server, model: Model, count: int = 20) -> None:
    """`count` computed requests: two sentences each (text), the cat photo (image)."""
    for i in range(count):
        if model.text:
            body = {"model": model.served_name, "input": [f"Sentence {i} of the warm-up.", f"And {i} more words."]}
            reply = requests.post(server.url + EMBEDDINGS, json=body, timeout=60)
        else:
            with CAT_JPEG.open("rb") as photo:
                reply = requests.post(server.url + "/predict", files={"image": photo}, headers=BYPASS_CACHE, timeout=60)
        reply.raise_for_status()


@dataclass(frozen=True)
class MemoryRow:
    model: str
    form: str
    workers: int
    private_mb: float
    """Mean over the workers."""
    pss_mb: float
    max_private_mb: float
    master_pss_mb: float


def measure_memory(model: Model, form: str, settings: dict[str, str], workers: int, tmp: Path) -> MemoryRow:
    server = start_server(tmp, {**common_settings(model, workers), **settings}, workers=workers, config=model.config)
    try:
        warm(server, model)
        memory = [read_memory(pid) for pid in server.workers()]
        master = read_memory(server.pid)
    finally:
        server.stop()
    return MemoryRow(
        model=model.name,
        form=form,
        workers=workers,
        private_mb=statistics.mean(m.private for m in memory) / MB,
        pss_mb=statistics.mean(m.pss for m in memory) / MB,
        max_private_mb=max(m.private for m in memory) / MB,
        master_pss_mb=master.pss / MB,
    )


@contextlib.contextmanager
def rss_peaks(pids: list[int], interval: float = 0.25) -> Iterator[dict[int, int]]:
    """Each pid's highest RSS while the block runs (sampled every `interval` s)."""
    peaks = {pid: read_memory(pid).rss for pid in pids}

    def sample() -> None:
        for pid in pids:
            with contextlib.suppress(OSError):
                peaks[pid] = max(peaks[pid], read_memory(pid).rss)

    with sampled(sample, interval):
        yield peaks


@dataclass(frozen=True)
class SpeedRow:
    model: str
    form: str
    req_per_s: float
    """Median over the rounds."""
    speed_vs_copy: float
    """Median of the per-round ratios to `copy`."""
    idle_rss_mb: float
    """Mean over the workers, before the first round."""
    high_water_mb: float
    """The largest worker's peak RSS minus its RSS before the first round."""
    end_private_mb: float


def rate(generator: LoadGenerator, seconds: float) -> float:
    step = generator.run_step(StepPlan(4, warmup=1.0, duration=seconds))
    if step.error_count:
        raise RuntimeError(f"{step.error_count} errors: {step.errors}")
    return step.throughput


def measure_speed(model: Model, args: argparse.Namespace, tmp: Path) -> list[SpeedRow]:
    workload: Workload = mixed_length_requests(model.served_name) if model.text else predict_request(CAT_JPEG, 1)
    with contextlib.ExitStack() as stack:
        servers: dict[str, Server] = {}
        for form, settings in forms(model).items():
            server = start_server(tmp, {**common_settings(model, 2), **settings}, workers=2, config=model.config)
            stack.callback(server.stop)
            warm(server, model)
            servers[form] = server
        idle = {form: {pid: read_memory(pid) for pid in s.workers()} for form, s in servers.items()}
        sides: dict[str, Callable[[], float]] = {}
        for form, server in servers.items():
            generator = stack.enter_context(LoadGenerator(server.url, workload, 4, conns_per_process=4))
            sides[form] = lambda g=generator: rate(g, args.seconds)  # type: ignore[misc]
        pids = [pid for s in servers.values() for pid in s.workers()]
        with rss_peaks(pids) as peaks:
            rates = alternating_rounds(sides, args.rounds, model.name)
        end = {form: [read_memory(pid) for pid in s.workers()] for form, s in servers.items()}
    return [
        SpeedRow(
            model=model.name,
            form=form,
            req_per_s=statistics.median(rates[form]),
            speed_vs_copy=statistics.median(a / b for a, b in zip(rates[form], rates["copy"], strict=True)),
            idle_rss_mb=statistics.mean(m.rss for m in idle[form].values()) / MB,
            high_water_mb=max(peaks[pid] - m.rss for pid, m in idle[form].items()) / MB,
            end_private_mb=max(m.private for m in end[form]) / MB,
        )
        for form in servers
    ]


def markdown(memory: list[MemoryRow], speed: list[SpeedRow], workers: list[int]) -> str:
    head = " | ".join(f"{n} workers: private / PSS MB per worker" for n in workers)
    lines = [
        f"| model | form | {head} | req/s (2 workers, 4 conns) | speed vs copy | RSS idle -> high-water |",
        "|---|---|" + "---|" * (len(workers) + 3),
    ]
    for row in speed:
        cells = []
        for n in workers:
            found = [m for m in memory if (m.model, m.form, m.workers) == (row.model, row.form, n)]
            cells.append(f"{found[0].private_mb:.0f} / {found[0].pss_mb:.0f}" if found else "-")
        lines.append(
            f"| {row.model} | {row.form} | {' | '.join(cells)} | {row.req_per_s:.1f} | {row.speed_vs_copy:.3f} "
            f"| {row.idle_rss_mb:.0f} -> +{row.high_water_mb:.0f} MB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0, help="load per form and round")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    chosen = [MODELS[name] for name in args.models.split(",")]
    memory: list[MemoryRow] = []
    speed: list[SpeedRow] = []
    with tempfile.TemporaryDirectory(prefix="onnxpool-memory-") as folder:
        tmp = Path(folder)
        for model in chosen:
            for form, settings in forms(model).items():
                for workers in args.workers:
                    memory.append(measure_memory(model, form, settings, workers, tmp))
                    row = memory[-1]
                    print(
                        f"  {model.name}, {form}, {workers} workers: {row.private_mb:.0f} MB private, "
                        f"{row.pss_mb:.0f} MB PSS",
                        file=sys.stderr,
                    )
            speed += measure_speed(model, args, tmp)
    flags = " ".join(sorted(f for f in cpu_flags() if f in {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}))
    print(f"CPU flags: {flags}; {len(os.sched_getaffinity(0))} cores\n")
    print(markdown(memory, speed, args.workers) + "\n")
    emit({"memory": [asdict(m) for m in memory], "speed": [asdict(s) for s in speed], "cpu_flags": flags}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
