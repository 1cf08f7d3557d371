"""`onnxpool bench URL`: sweep concurrency against a running server and report each step."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxpool.measure.loadgen import LoadGenerator, StepPlan, StepResult, Workload, total_cpu_seconds
from onnxpool.measure.payloads import Mode, prepare
from onnxpool.measure.progress import Progress
from onnxpool.measure.repeats import RepeatWorkload


@dataclass(frozen=True)
class BenchOptions:
    """Everything one `bench` run needs, already validated by the CLI."""

    url: str
    mode: Mode
    concurrency: tuple[int, ...]
    warmup: float = 2.0
    duration: float | None = 10.0
    requests: int | None = None
    model: str = "efficientnet-lite0"
    batch: int = 1
    image: Path | None = None
    conns_per_process: int = 2
    timeout: float = 60.0
    repeat_fraction: float | None = None
    """--mode predict: this fraction of requests repeats earlier images (bench.repeats); None = one image."""


@dataclass
class BenchReport:
    """The steps of one run, and what the load generator cost in total."""

    options: BenchOptions
    steps: list[StepResult] = field(default_factory=list)
    client_cpu_seconds: float = 0.0
    wall_seconds: float = 0.0

    def meta(self) -> dict[str, Any]:
        o = self.options
        return {
            "url": o.url,
            "mode": o.mode,
            "model": o.model,
            "batch": o.batch,
            "image": str(o.image) if o.image else None,
            "warmup_s": o.warmup,
            "duration_s": o.duration,
            "requests_per_step": o.requests,
            "connections_per_process": o.conns_per_process,
            "repeat_fraction": o.repeat_fraction,
            "client_cpu_seconds_total": round(self.client_cpu_seconds, 3),
            "wall_seconds": round(self.wall_seconds, 3),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }


def workload(options: BenchOptions) -> Workload:
    """What the run sends: the one prepared request of the mode, or the repeat workload."""
    if options.repeat_fraction is None:
        return prepare(options.mode, options.url, model=options.model, batch=options.batch, image=options.image)
    if options.mode != "predict" or options.image is None or options.batch != 1:
        raise ValueError("--repeat-fraction works with --mode predict, a JPEG --image and --batch 1")
    repeats = RepeatWorkload(options.image, options.repeat_fraction)
    repeats.sample()  # a JPEG? (raises ValueError before any load process starts)
    return repeats


def run_bench(options: BenchOptions, progress: Progress | None = None, request: Workload | None = None) -> BenchReport:
    """Run every concurrency step in order on one pool of load-generator processes."""
    progress = progress or Progress(enabled=False)
    request = request or workload(options)
    report = BenchReport(options)
    cpu_before = total_cpu_seconds()
    started = time.monotonic()
    generator = LoadGenerator(
        options.url,
        request,
        max(options.concurrency),
        conns_per_process=options.conns_per_process,
        timeout=options.timeout,
    )
    with generator:
        for i, concurrency in enumerate(options.concurrency, 1):
            plan = StepPlan(concurrency, options.warmup, options.duration, options.requests)
            progress.status(f"step {i}/{len(options.concurrency)}: concurrency {concurrency}", force=True)
            step = generator.run_step(plan, progress.status)
            report.steps.append(step)
            progress.done(
                f"step {i}/{len(options.concurrency)}: concurrency {concurrency}: "
                f"{step.throughput:.1f} req/s, p99 {step.percentile(99) * 1000:.1f} ms, {step.error_count} errors"
            )
    report.wall_seconds = time.monotonic() - started
    report.client_cpu_seconds = total_cpu_seconds() - cpu_before
    return report


def client_cpu_note(report: BenchReport) -> str:
    """One line about the load generator's own cost, so a reader can tell if it was the bottleneck."""
    total = sum(s.requests for s in report.steps)
    per = report.client_cpu_seconds / total * 1000 if total else float("nan")
    return (
        f"load generator: {report.client_cpu_seconds:.2f} CPU s in {report.wall_seconds:.1f} s "
        f"({per:.2f} ms CPU per request over {total} requests, warm-up and start-up included)"
    )


def parse_steps(text: str) -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8); each a positive integer."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"concurrency must be a comma-separated list of positive integers, got {text!r}")
        values.append(int(part))
    return tuple(values)


def parse_seconds(text: str) -> float:
    """'120s', '2m', '1.5' (seconds) -> seconds; must be > 0."""
    raw = text.strip().lower()
    factor = 1.0
    if raw.endswith("ms"):
        raw, factor = raw[:-2], 0.001
    elif raw.endswith("s"):
        raw = raw[:-1]
    elif raw.endswith("m"):
        raw, factor = raw[:-1], 60.0
    try:
        value = float(raw) * factor
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 10, 10s, 500ms, 2m)") from None
    if not value > 0:
        raise ValueError(f"duration must be > 0, got {text!r}")
    return value


def unique_steps(steps: Sequence[int]) -> tuple[int, ...]:
    """Steps in the given order, duplicates dropped."""
    return tuple(dict.fromkeys(steps))
