"""`onnxpool tune`: find the workers x threads_per_worker layout that serves this model fastest here.

1. In-process (cheap): every layout that splits the usable cores evenly
   (2x1, 1x2 on 2 cores; 8x1, 4x2, 2x4, 1x8 on 8) is measured with pinned
   processes (`bench.limit`), then the best one at several batch sizes.
2. Over HTTP (what counts): the top candidates are each started as a real
   gunicorn (`bench.servers.start_server`) and measured with `bench` (v2
   binary tensors) at a target concurrency; one server at a time. After the
   load, each worker's memory (private and PSS, /proc/<pid>/smaps_rollup) is
   read, so a layout's memory is reported beside its req/s; then a lone client (concurrency 1),
   for the latency of the quiet hours. With `[model] wide_threads` (workers/wide.py) a lone
   request of a several-worker layout runs on every idle core, as one wide worker's would: the
   table says how wide, and its p50 at c=1 shows what the low load gets from each layout.
The winner is the best CONFIRMED HTTP throughput. Everything runs inside a
time budget: durations are sized from it, and candidates that no longer fit
are skipped (the first one is always confirmed, so there is a winner).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from onnxpool.config.loader import load_settings
from onnxpool.config.settings import Settings
from onnxpool.measure.httpbench import BenchOptions, run_bench
from onnxpool.measure.limit import LimitPlan, LimitResult, measure_limit
from onnxpool.measure.loadgen import StepResult
from onnxpool.measure.progress import Progress, bar
from onnxpool.measure.report import format_table
from onnxpool.measure.servers import start_server
from onnxpool.measure.tomledit import set_server_layout
from onnxpool.workers.cores import Layout, plan_layout, usable_cores
from onnxpool.workers.memory import MB, ProcessMemory, read_memory
from onnxpool.workers.wide import wide_threads

# Rough fixed costs, used only to size durations within the budget.
INPROCESS_OVERHEAD_S = 3.0  # spawn + import onnxruntime + session build + warm-up
HTTP_OVERHEAD_S = 6.0  # gunicorn start, model probe, workers warm-up, stop


@dataclass(frozen=True)
class TuneOptions:
    config: Path | None = None
    budget: float = 120.0
    concurrency: int | None = None
    batches: tuple[int, ...] = (1, 4, 8)
    top: int = 3


@dataclass
class Candidate:
    """One layout and what was measured for it."""

    layout: Layout
    inprocess: LimitResult | None = None
    http: StepResult | None = None
    lone: StepResult | None = None
    """One client, after the load: a lone request's latency (a wide run where the setting allows it)."""
    memory: tuple[ProcessMemory, ...] = ()
    """Each worker's memory after the HTTP load (confirmed candidates only)."""
    batch_items_per_s: dict[int, float] = field(default_factory=dict)

    @property
    def private_mb(self) -> float:
        """The largest private memory of a worker (MB); NaN if not measured."""
        return max(m.private for m in self.memory) / MB if self.memory else float("nan")

    @property
    def pss_mb(self) -> float:
        """The workers' mean PSS (MB); NaN if not measured."""
        return sum(m.pss for m in self.memory) / len(self.memory) / MB if self.memory else float("nan")

    @property
    def workers(self) -> int:
        return self.layout.workers

    @property
    def threads(self) -> int:
        return self.layout.threads

    @property
    def name(self) -> str:
        return f"{self.workers}x{self.threads}"


@dataclass
class TuneResult:
    candidates: list[Candidate]
    concurrency: int
    cores: int
    measured_at: str
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    model: str = ""
    """The model measured: `[model].name (path)` of the settings the servers start with."""
    wide: int | str = "off"
    """`[model] wide_threads` of those settings: how wide a lone request of each layout runs."""

    @property
    def confirmed(self) -> list[Candidate]:
        """Candidates measured over HTTP, best throughput first."""
        done = [c for c in self.candidates if c.http is not None and c.http.ok > 0]
        return sorted(done, key=lambda c: -c.http.throughput if c.http else 0.0)

    @property
    def winner(self) -> Candidate | None:
        confirmed = self.confirmed
        return confirmed[0] if confirmed else None


def candidate_layouts(cores: list[int]) -> list[Layout]:
    """Every even split of the cores: threads per worker is each divisor of the core count."""
    n = len(cores)
    return [plan_layout(cores, n // t, t) for t in range(1, n + 1) if n % t == 0]


@dataclass(frozen=True)
class _Durations:
    inprocess: float
    http: float

    @property
    def inprocess_warmup(self) -> float:
        return min(1.0, self.inprocess / 4)

    @property
    def http_warmup(self) -> float:
        return min(2.0, self.http / 4)

    @property
    def lone(self) -> float:
        """The lone client's step: long enough for a p50, a quarter of the load's."""
        return max(1.0, self.http / 4)


def plan_durations(budget: float, layouts: int, batches: int, confirmations: int) -> _Durations:
    """Measured seconds per in-process run and per HTTP run so the whole run fits `budget`."""
    runs = layouts + max(0, batches - 1)
    spare = budget - runs * INPROCESS_OVERHEAD_S - confirmations * HTTP_OVERHEAD_S
    per_in = spare * 0.35 / runs / 1.25 if runs else 0.0
    per_http = spare * 0.65 / max(1, confirmations) / 1.5  # the load, its warm-up, and the lone client's quarter
    return _Durations(inprocess=min(10.0, max(0.5, per_in)), http=min(20.0, max(1.0, per_http)))


def _limit(settings: Settings, layout: Layout, batch: int, d: _Durations) -> LimitResult:
    plan = LimitPlan(
        settings.model.path,
        layout,
        batch=batch,
        duration=d.inprocess,
        warmup=d.inprocess_warmup,
        spin=settings.server.spin,
        optimization=settings.model.graph_optimization_level,
    )
    return measure_limit(plan)


def _confirm(
    settings: Settings, candidate: Candidate, options: TuneOptions, concurrency: int, d: _Durations, log_dir: Path
) -> tuple[StepResult, StepResult, tuple[ProcessMemory, ...]]:
    """Start a real gunicorn with this layout, bench it at `concurrency`, read its workers' memory, bench one
    client, stop it."""
    overrides = {k: v for k, v in os.environ.items() if k.startswith("ONNXPOOL_")}
    overrides["ONNXPOOL_SERVER__WORKERS"] = str(candidate.workers)
    overrides["ONNXPOOL_SERVER__THREADS_PER_WORKER"] = str(candidate.threads)
    overrides.pop("ONNXPOOL_CONFIG", None)
    server = start_server(
        log_dir, overrides, workers=candidate.workers, config=options.config, name=f"tune-{candidate.name}"
    )
    try:
        bench = BenchOptions(
            url=server.url,
            mode="v2-binary",
            concurrency=(concurrency,),
            warmup=d.http_warmup,
            duration=d.http,
            model=settings.model.name,
        )
        step = run_bench(bench).steps[0]
        memory = tuple(read_memory(pid) for pid in server.workers())
        lone = run_bench(replace(bench, concurrency=(1,), warmup=0.5, duration=d.lone)).steps[0]
        return step, lone, memory
    finally:
        server.stop()


def run_tune(options: TuneOptions, progress: Progress | None = None) -> TuneResult:
    """Measure the layouts in-process, confirm the best over HTTP, within `options.budget` seconds."""
    progress = progress or Progress(enabled=False)
    started = time.monotonic()
    settings = load_settings(options.config).settings
    cores = usable_cores()
    layouts = candidate_layouts(cores)
    concurrency = options.concurrency or 2 * len(cores)
    confirmations = min(options.top, len(layouts))
    durations = plan_durations(options.budget, len(layouts), len(options.batches), confirmations)
    result = TuneResult(
        [Candidate(layout) for layout in layouts],
        concurrency,
        len(cores),
        time.strftime("%Y-%m-%d %H:%M"),
        model=f"{settings.model.name} ({settings.model.path})",
        wide=settings.model.wide_threads,
    )

    def show(text: str) -> None:
        progress.status(f"{bar((time.monotonic() - started) / options.budget)} {text}", force=True)

    for candidate in result.candidates:
        show(f"in-process {candidate.name}, batch 1 ({durations.inprocess:.1f}s)")
        candidate.inprocess = _limit(settings, candidate.layout, 1, durations)
        candidate.batch_items_per_s[1] = candidate.inprocess.items_per_second
    ranked = sorted(result.candidates, key=lambda c: -(c.inprocess.items_per_second if c.inprocess else 0.0))
    best = ranked[0]
    for batch in options.batches:
        if batch == 1 or batch > settings.limits.max_batch:
            continue
        show(f"in-process {best.name}, batch {batch}")
        best.batch_items_per_s[batch] = _limit(settings, best.layout, batch, durations).items_per_second

    with tempfile.TemporaryDirectory(prefix="onnxpool-tune-") as tmp:
        for i, candidate in enumerate(ranked[:confirmations]):
            elapsed = time.monotonic() - started
            cost = HTTP_OVERHEAD_S + durations.http + durations.http_warmup + durations.lone + 0.5
            if i > 0 and elapsed + cost > options.budget:
                result.notes.append(f"{candidate.name}: not confirmed over HTTP (budget reached)")
                continue
            show(f"HTTP {candidate.name} at concurrency {concurrency} ({durations.http:.1f}s)")
            candidate.http, candidate.lone, candidate.memory = _confirm(
                settings, candidate, options, concurrency, durations, Path(tmp)
            )
    result.seconds = time.monotonic() - started
    winner = result.winner
    progress.done(
        f"{bar(1.0)} done in {result.seconds:.0f}s" + (f": best layout {winner.name}" if winner else ": no winner")
    )
    return result


def ranking_rows(result: TuneResult) -> list[dict[str, object]]:
    """Confirmed candidates first (by HTTP throughput), then the rest (by in-process throughput)."""
    confirmed = result.confirmed
    rest = sorted(
        (c for c in result.candidates if c not in confirmed),
        key=lambda c: -(c.inprocess.items_per_second if c.inprocess else 0.0),
    )
    rows: list[dict[str, object]] = []
    for rank, c in enumerate([*confirmed, *rest], 1):
        batches = ", ".join(f"b{b}: {v:.0f}" for b, v in sorted(c.batch_items_per_s.items()) if b != 1)
        rows.append(
            {
                "rank": rank,
                "layout": c.name,
                "wide": wide_threads(c.layout, result.wide) or "-",
                "http_rps": c.http.throughput if c.http else float("nan"),
                "http_p99": c.http.percentile(99) * 1000 if c.http else float("nan"),
                "http_errors": c.http.error_count if c.http else float("nan"),
                "lone_p50": c.lone.percentile(50) * 1000 if c.lone else float("nan"),
                "private_mb": c.private_mb,
                "pss_mb": c.pss_mb,
                "inproc": c.inprocess.items_per_second if c.inprocess else float("nan"),
                "inproc_p99": c.inprocess.percentile(99) * 1000 if c.inprocess else float("nan"),
                "batches": batches or "-",
            }
        )
    return rows


def format_ranking(result: TuneResult) -> str:
    columns = (
        ("rank", "rank", "{}"),
        ("layout", "workers x threads", "{}"),
        ("wide", "lone request threads", "{}"),
        ("http_rps", f"HTTP req/s @c{result.concurrency}", "{:.1f}"),
        ("http_p99", "HTTP p99 ms", "{:.1f}"),
        ("http_errors", "errors", "{}"),
        ("lone_p50", "HTTP p50 ms @c1", "{:.1f}"),
        ("private_mb", "MB private/worker", "{:.0f}"),
        ("pss_mb", "MB PSS/worker", "{:.0f}"),
        ("inproc", "in-process img/s", "{:.1f}"),
        ("inproc_p99", "in-process p99 ms", "{:.1f}"),
        ("batches", "in-process batched img/s", "{}"),
    )
    lines = [
        f"# onnxpool tune: {result.cores} usable cores, {result.seconds:.0f}s, {result.measured_at}"
        + (f", model {result.model}" if result.model else ""),
        format_table(ranking_rows(result), columns),
        *result.notes,
    ]
    winner = result.winner
    if winner is not None:
        wide = wide_threads(winner.layout, result.wide)
        lone = f"; a lone request runs wide on {wide} threads (wide_threads = {result.wide!r})" if wide else ""
        lines.append(f"recommended: workers = {winner.workers}, threads_per_worker = {winner.threads}{lone}")
    return "\n".join(lines)


def winner_note(result: TuneResult) -> str:
    """One line for the config file: what was measured, when, and the runner-up."""
    winner = result.winner
    assert winner is not None and winner.http is not None
    text = (
        f"{result.measured_at}: {winner.name} measured best, {winner.http.throughput:.1f} req/s, "
        f"per worker {winner.private_mb:.0f} MB private, {winner.pss_mb:.0f} MB PSS, "
        f"p99 {winner.http.percentile(99) * 1000:.0f} ms over HTTP (v2 binary, concurrency {result.concurrency}, "
        f"{result.cores} cores)"
    )
    others = [f"{c.name} {c.http.throughput:.1f} req/s" for c in result.confirmed[1:] if c.http]
    return text + (f"; also measured {', '.join(others)}" if others else "")


def write_winner(path: Path, result: TuneResult) -> None:
    """Update [server] workers / threads_per_worker in `path` with the winner, keeping all else."""
    winner = result.winner
    if winner is None:
        raise ValueError("no winner to write")
    text = path.read_text()
    path.write_text(set_server_layout(text, winner.workers, winner.threads, winner_note(result)))
