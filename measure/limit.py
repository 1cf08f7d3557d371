"""`onnxpool limit MODEL`: the in-process upper bound for a model on this machine (no HTTP).

Three pipelines: `raw` (inference of random tensors of the model's shape), `image` (JPEG decode +
preprocessing + inference) and `task` (the served task's own requests, read -> run -> reply ->
JSON, `measure.task_input`: what one request costs a worker, for `onnxpool tune` on several models).
N processes, each pinned to its own core share exactly as gunicorn workers are
(`workers.cores.Layout.core_share_for`), each running inferences back to back
for the same window. What onnxpool serves over HTTP can approach this number,
never beat it, so `bench` results are read against it.

Process rule (as in the server): every onnxruntime session is built inside the
process that uses it, after that process started. The processes are started
with 'spawn', so nothing (no thread pool, no session) is inherited.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import multiprocessing.sharedctypes
import os
import queue
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from onnxpool.config.settings import LimitsSettings
from onnxpool.tasks.image.settings import PreprocessSettings
from onnxpool.workers.cores import Layout

if TYPE_CHECKING:
    from onnxpool.config.loader import LoadedSettings

Pipeline = Literal["raw", "image", "task"]
PIPELINES: tuple[Pipeline, ...] = ("raw", "image", "task")


def image_pipeline_available() -> bool:
    """True when `onnxpool.tasks.image.imaging` (the /predict image pipeline) is installed."""
    return importlib.util.find_spec("onnxpool.tasks.image.imaging") is not None


@dataclass(frozen=True)
class LimitPlan:
    """One in-process measurement: a layout, a batch size, a pipeline, a window."""

    model_path: Path
    layout: Layout
    batch: int = 1
    pipeline: Pipeline = "raw"
    duration: float = 5.0
    warmup: float = 1.0
    spin: bool = False
    optimization: str = "all"
    image: bytes | None = None
    feeds: Path | None = None
    """An .npz of the inputs to run (e.g. tokenized sentences) instead of random ones of the model's shape."""
    preprocess: PreprocessSettings = field(default_factory=PreprocessSettings)
    limits: LimitsSettings = field(default_factory=LimitsSettings)
    settings: LoadedSettings | None = None
    """The `task` pipeline: the settings whose task is built (as a worker builds it) and run on its
    sample requests (`measure.task_input`); `batch` items per request."""


@dataclass(frozen=True)
class LimitResult:
    """Throughput (items/s) and per-call latency of one plan."""

    workers: int
    threads: int
    batch: int
    pipeline: Pipeline
    seconds: float
    calls: int
    latencies: np.ndarray
    inputs: str = ""
    """What each call ran on, when the pipeline says (the `task` pipeline: its sample requests)."""

    @property
    def items_per_second(self) -> float:
        return self.calls * self.batch / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies.size else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "layout": f"{self.workers}x{self.threads}",
            "workers": self.workers,
            "threads": self.threads,
            "batch": self.batch,
            "pipeline": self.pipeline,
            "calls": self.calls,
            "items_per_s": round(self.items_per_second, 2),
            "p50_ms": round(self.percentile(50) * 1000, 2),
            "p99_ms": round(self.percentile(99) * 1000, 2),
        }


def random_feeds(session: Any, batch: int) -> dict[str, np.ndarray]:
    """Random inputs of the model's shapes (dynamic dims: `batch` first, 1 elsewhere), seeded."""
    from onnxpool.workers.model_info import static_shape
    from onnxpool.workers.session import model_info_of

    rng = np.random.default_rng(0)
    feeds = {}
    for spec in model_info_of(session).inputs:
        if spec.dtype is None:
            raise ValueError(f"input '{spec.name}' is {spec.onnx_type}: only numeric inputs can be measured")
        shape = static_shape(spec, batch)
        data = rng.standard_normal(shape) if spec.dtype.kind == "f" else rng.integers(0, 2, shape)
        feeds[spec.name] = data.astype(spec.dtype)
    return feeds


def _saved_feeds(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def _limit_worker(plan: LimitPlan, slot: int, window: Any, go: Any, results: Any) -> None:
    """One pinned process: build the session HERE (after start), warm up, then run until the window ends."""
    cores = plan.layout.core_share_for(slot)
    os.sched_setaffinity(0, cores)
    from onnxpool.workers.session import build_session, warm_up  # onnxruntime is imported after pinning

    session = build_session(plan.model_path, plan.layout.threads, plan.spin, plan.optimization)
    warm_up(session, 3)
    run_once, inputs = _runner(plan, session)
    run_once()
    results.put(("ready", slot, inputs))
    go.wait()
    t0, t_end = window[0], window[1]
    latencies = array("d")
    while True:
        start = time.monotonic()
        if start >= t_end:
            break
        run_once()
        end = time.monotonic()
        if t0 <= end <= t_end:
            latencies.append(end - start)
    results.put(("done", slot, latencies.tobytes()))


def _runner(plan: LimitPlan, session: Any) -> tuple[Callable[[], object], str]:
    """A no-argument callable doing one unit of work (inference, decode+preprocess+inference, or one
    request of the task), and what it runs on ("" unless the pipeline says)."""
    if plan.pipeline == "task":
        from onnxpool.measure.task_input import task_runner

        if plan.settings is None:
            raise ValueError("the task pipeline needs the settings of the task")
        return task_runner(
            plan.settings, session, lambda: random_feeds(session, plan.batch), plan.batch, plan.layout.threads
        )
    feeds = random_feeds(session, plan.batch) if plan.feeds is None else _saved_feeds(plan.feeds)
    if plan.pipeline == "raw":
        return (lambda: session.run(None, feeds)), ""
    from onnxpool.tasks.image.imaging import ImagePipeline  # type: ignore[import-not-found, unused-ignore]

    if plan.image is None:
        raise ValueError("the image pipeline needs an image")
    pipeline = ImagePipeline(plan.preprocess, plan.limits)
    images = [plan.image] * plan.batch
    name = next(iter(feeds))

    def run() -> None:
        session.run(None, {name: pipeline.preprocess_batch(images)})

    return run, ""


def measure_limit(plan: LimitPlan, start_timeout: float = 120.0) -> LimitResult:
    """Run `plan` on `layout.workers` pinned processes; returns the combined throughput."""
    if plan.pipeline == "image" and not image_pipeline_available():
        raise RuntimeError("the image pipeline (server.imaging) is not installed in this onnxpool")
    ctx = mp.get_context("spawn")
    window = multiprocessing.sharedctypes.RawArray("d", 2)
    go = ctx.Event()
    results: Any = ctx.Queue()
    processes = [
        ctx.Process(target=_limit_worker, args=(plan, slot, window, go, results), daemon=True)
        for slot in range(plan.layout.workers)
    ]
    for process in processes:
        process.start()
    try:
        ready = _wait_for(results, "ready", len(processes), processes, start_timeout)
        window[0] = time.monotonic() + plan.warmup
        window[1] = window[0] + plan.duration
        go.set()
        done = _wait_for(results, "done", len(processes), processes, plan.warmup + plan.duration + 60)
    finally:
        for process in processes:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
    latencies = np.concatenate([np.frombuffer(d[2], dtype=np.float64) for d in done])
    return LimitResult(
        plan.layout.workers,
        plan.layout.threads,
        plan.batch,
        plan.pipeline,
        plan.duration,
        latencies.size,
        latencies,
        inputs=ready[0][2],
    )


def _wait_for(results: Any, kind: str, count: int, processes: list[Any], timeout: float) -> list[Any]:
    deadline = time.monotonic() + timeout
    got: list[Any] = []
    while len(got) < count:
        try:
            message = results.get(timeout=0.5)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in processes):
                raise RuntimeError("a measuring process failed (see its traceback above)") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"measuring processes not {kind} after {timeout:.0f}s") from None
            continue
        if message[0] == kind:
            got.append(message)
    return got


def measure_alternating(plans: dict[str, LimitPlan], rounds: int, on_step: Any = None) -> dict[str, list[LimitResult]]:
    """Each plan `rounds` times, one after the other, the order rotated every round.

    For side-by-side comparisons in ONE run (FP32 vs INT8): load from anything else on the
    machine then hits every plan alike, and per-round ratios cancel most of it.
    `on_step(round, name)` is called before each measurement (progress display).
    """
    names = list(plans)
    results: dict[str, list[LimitResult]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if on_step is not None:
                on_step(r, name)
            results[name].append(measure_limit(plans[name]))
    return results


def median_ratio(results: dict[str, list[LimitResult]], name: str, reference: str) -> float:
    """Median over rounds of items/s of `name` divided by items/s of `reference` in the same round."""
    ratios = [
        a.items_per_second / b.items_per_second
        for a, b in zip(results[name], results[reference], strict=True)
        if b.items_per_second > 0
    ]
    return float(np.median(ratios)) if ratios else float("nan")
