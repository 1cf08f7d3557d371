"""Build the worker's ONE onnxruntime session, warm it up, and run inferences.

Process rule: a session (and its thread pool) must be created in the process
that uses it, AFTER gunicorn forks; an onnxruntime thread pool does not survive
fork. The master therefore never calls `build_session`; it validates the model
in a throw-away subprocess (`workers.preflight`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from onnxpool.workers.cpu_fit import METADATA_PREFIX
from onnxpool.workers.memory import MB, anonymous_bytes, trim_heap
from onnxpool.workers.model_info import ModelInfo, TensorSpec, refused_feeds, static_shape
from onnxpool.workers.wide import LENT_NICE, Seat, WidePlan, lower_priority, thread_ids

if TYPE_CHECKING:
    import onnxruntime as ort

# onnxruntime is imported inside the functions that build sessions, never at
# module level: the gunicorn master imports this module (for RUNTIME) while
# preloading the app, and importing onnxruntime starts a background thread.
# A thread alive in the master at fork time leaves its locks and condition
# variables half-owned in every worker (seen as workers hanging in
# onnxruntime's exit handlers). Only post_fork, in the worker, imports it.
OPT_LEVELS: dict[str, str] = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


# onnxruntime's basic-level `WeightBiasQuantization` transformer quantizes the float weights of
# any Conv/Gemm fed by a DequantizeLinear: in a mixed-precision (QDQ) model it silently
# re-quantizes, per tensor, exactly the layers `onnxpool quantize` kept in float because INT8
# destroyed them (EfficientNet-Lite0, block 0's depthwise conv kept float: top-1 agreement
# with FP32 0.865 with it disabled, 0.594 with it on). A float model has no DequantizeLinear,
# so disabling it changes nothing there; every session is therefore built without it.
DISABLED_OPTIMIZERS: tuple[str, ...] = ("WeightBiasQuantization",)


def _dims(shape: Sequence[object]) -> tuple[int, ...]:
    """onnxruntime reports symbolic dims as strings or None: those are dynamic (-1)."""
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)


def model_info_of(session: ort.InferenceSession) -> ModelInfo:
    """Inputs and outputs of a session, as a ModelInfo (with the model's onnxpool.* metadata)."""
    custom = session.get_modelmeta().custom_metadata_map
    return ModelInfo(
        inputs=tuple(TensorSpec(i.name, i.type, _dims(i.shape)) for i in session.get_inputs()),
        outputs=tuple(TensorSpec(o.name, o.type, _dims(o.shape)) for o in session.get_outputs()),
        metadata=tuple(sorted((k, v) for k, v in custom.items() if k.startswith(METADATA_PREFIX))),
    )


def _options(intra_op_threads: int, spin: bool, optimization: str, prepacking: bool) -> ort.SessionOptions:
    """Session options with EXPLICIT thread counts.

    onnxruntime sizes its default pool from the machine's core count and ignores
    the affinity mask, so N pinned workers with defaults would each spawn one
    thread per core and fight over them; the count is therefore always set.
    """
    import onnxruntime as ort  # after fork: see OPT_LEVELS above

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[optimization])
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if not prepacking:
        options.add_session_config_entry("session.disable_prepacking", "1")
    options.log_severity_level = 3  # errors only: warnings about unused initialisers are noise
    return options


def _session(model_path: Path, options: ort.SessionOptions) -> ort.InferenceSession:
    import onnxruntime as ort

    return ort.InferenceSession(
        str(model_path),
        sess_options=options,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=list(DISABLED_OPTIMIZERS),
    )


def build_session(
    model_path: Path,
    intra_op_threads: int,
    spin: bool = False,
    optimization: str = "all",
    prepacking: bool = True,
) -> ort.InferenceSession:
    """One CPU session with explicit thread counts (`_options`); `prepacking` False: the least memory."""
    return _session(model_path, _options(intra_op_threads, spin, optimization, prepacking))


def build_wide_session(
    model_path: Path, plan: WidePlan, optimization: str, prepacking: bool, lent_nice: int = LENT_NICE
) -> ort.InferenceSession:
    """The worker's wide session (workers/wide.py): `plan.threads` intra-op threads on the plan's cores.

    Its threads spin within a run and stop when it ends. Measured on the 2-core dev VM
    (docs/BENCHMARKS.md): spinning within the run is 1.1-1.3x faster than not (the image
    model: 2.7 ms against 3.3-4.3 ms, one core 4.7-4.9 ms), and without the stop a spinning
    thread kept burning ~32 ms of CPU per 200 ms after each run, on another worker's core.
    """
    options = _options(plan.threads, True, optimization, prepacking)
    options.add_session_config_entry("session.force_spinning_stop", "1")
    if plan.affinities:
        options.add_session_config_entry("session.intra_op_thread_affinities", plan.affinities)
    before = thread_ids()
    session = _session(model_path, options)  # its pool threads are made here
    lower_priority(thread_ids() - before, lent_nice)  # they run on lent cores (workers/wide.py, LENT_NICE)
    return session


# The served copy (docs/ARCHITECTURE.md, "one copy of the weights per host"): every
# initializer of at least this many bytes goes to the data file, which onnxruntime maps
# instead of reading, so the workers of a host share its pages. Smaller ones stay in the
# graph file, which each worker parses into its own heap (a few KB in all).
EXTERNAL_MIN_BYTES = 1024


def mapped_data_file(copy: Path) -> Path:
    """The data file beside a copy written by `write_mapped_copy`."""
    return copy.with_name(copy.name + ".data")


def write_mapped_copy(source: Path, target: Path, optimization: str, prepacking: bool) -> None:
    """Write `source` as onnxruntime optimises it into `target`, its weights in `mapped_data_file(target)`.

    A session made from `source` in the form workers load (this level, these disabled
    optimizers) saves the optimised graph; its large initializers go to one data file that
    each worker's session maps, page-aligned, rather than copying into its heap. With
    `prepacking` the kernels' prepacked weights (MatMul and Conv weights re-laid out for
    MLAS, as large as the weights themselves) are saved there too, and a session made from
    the copy maps them instead of packing its own: full speed with one copy per host.
    Without it workers run unpacked weights (session.disable_prepacking). Runs in the
    preflight subprocess only: the master never imports onnxruntime.
    """
    options = _options(1, False, optimization, prepacking)
    options.optimized_model_filepath = str(target)
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", mapped_data_file(target).name
    )
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", str(EXTERNAL_MIN_BYTES)
    )
    if prepacking:
        options.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    _session(source, options)


@dataclass(frozen=True)
class WarmupReport:
    """Timings of the model load and the warm-up runs, for logs and metrics."""

    load_seconds: float
    run_seconds: tuple[float, ...]
    wide_run_seconds: tuple[float, ...] = ()
    """The wide session's warm-up runs (workers/wide.py; none without one)."""

    @property
    def total_seconds(self) -> float:
        return self.load_seconds + sum(self.run_seconds) + sum(self.wide_run_seconds)


def warmup_feeds(info: ModelInfo) -> dict[str, np.ndarray] | None:
    """Zeros of each input's smallest shape (dynamic dims 1); None for string inputs."""
    feeds = {}
    for spec in info.inputs:
        dtype = spec.dtype
        if dtype is None:
            return None  # string inputs: nothing sensible to synthesise
        feeds[spec.name] = np.zeros(static_shape(spec), dtype=dtype)
    return feeds


def idle_feeds(info: ModelInfo, known: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
    """The tiny run that gives the arena back: zeros of the smallest shape, or, where the task showed
    what the model takes (a dynamic height and width that size 1 does not fit), its sample's feeds."""
    if known is not None:
        return dict(known)
    return warmup_feeds(info)


def warm_up(
    session: ort.InferenceSession,
    runs: int,
    heartbeat: Callable[[], None] | None = None,
    feeds: Mapping[str, np.ndarray] | None = None,
) -> list[float]:
    """Run `runs` inferences so the first real request is not the slow one: on `feeds` (what the task's
    own sample request made, `onnxpool.tasks.rehearsal`), else on zeros of each input's smallest shape."""
    feeds = feeds if feeds is not None else warmup_feeds(model_info_of(session))
    if feeds is None:
        return []
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
        if heartbeat is not None:
            heartbeat()
    return times


ArenaMode = Literal["auto", "keep", "release"]

# Why "auto" keeps the arena and bounds the worker instead of releasing after every run
# (docs/BENCHMARKS.md, "What load leaves behind"): onnxruntime's arena frees its chunks into
# glibc's heap, and glibc keeps freed pages that sit between live allocations, so releasing
# after each run of a mixed-length load grew a MiniLM worker by ~100 MB in 45 s (and +327 MB
# in 2 min before), while every run paid for allocating its memory again. Kept, the arena
# holds the largest run's memory, which the text tasks cap (`sub_batch_tokens`): +25 MB, and
# the fastest. A request larger than the usual (an uncapped tensors model) is what the bound
# is for: past it, one tiny run gives the arena back and the heap is trimmed.
SHRINK_ARENA = ("memory.enable_memory_arena_shrinkage", "cpu:0")


class SessionRuntime:
    """The process's one session behind a lock.

    The lock matters for gunicorn's gthread workers: concurrent request threads
    take turns, so a worker never runs two inferences at once on its core share
    (which would oversubscribe it). Under sync workers it is never contended.
    """

    def __init__(self) -> None:
        self._session: ort.InferenceSession | None = None
        self._info: ModelInfo | None = None
        self._lock = threading.Lock()
        self.intra_op_threads = 0
        self.warmup: WarmupReport | None = None
        self.arena: ArenaMode = "keep"
        self.headroom = 0
        self.limit = 0
        """"auto": anonymous bytes past which the arena and the heap are given back (0: no bound)."""
        self.releases = 0
        """How often "auto" gave memory back."""
        self._run_options: ort.RunOptions | None = None
        self._shrink: ort.RunOptions | None = None
        self._idle_feeds: dict[str, np.ndarray] | None = None
        self._wide: ort.InferenceSession | None = None
        self._seat: Seat | None = None
        self.last_wide = 0
        """The threads of this process's latest run if it was wide (workers/wide.py), else 0."""
        self._ran = False
        """A run since the last `give_back`: a reply that ran nothing (a shed 503, a 4xx) skips the check."""

    def load(
        self,
        model_path: Path,
        intra_op_threads: int,
        *,
        spin: bool = False,
        optimization: str = "all",
        warmup_runs: int = 3,
        heartbeat: Callable[[], None] | None = None,
        memory_arena: ArenaMode = "keep",
        headroom_mb: int = 64,
        prepacking: bool = True,
        seat: Seat | None = None,
        feeds: Mapping[str, np.ndarray] | None = None,
    ) -> WarmupReport:
        """Build the session (and with `seat.plan`, the wide one) and warm it up; ready when this returns."""
        import onnxruntime as ort  # in the worker, after fork (module comment above)

        start = time.perf_counter()
        session = build_session(model_path, intra_op_threads, spin, optimization, prepacking)
        plan = seat.plan if seat is not None else None
        wide = build_wide_session(model_path, plan, optimization, prepacking) if plan is not None else None
        load_seconds = time.perf_counter() - start
        runs = warm_up(session, warmup_runs, heartbeat, feeds)
        wide_runs = warm_up(wide, warmup_runs, heartbeat, feeds) if wide is not None else []
        info = model_info_of(session)
        shrink = ort.RunOptions()
        shrink.add_run_config_entry(*SHRINK_ARENA)
        with self._lock:
            self._session, self._info, self._wide, self._seat = session, info, wide, seat
            self.arena, self._shrink, self._idle_feeds = memory_arena, shrink, idle_feeds(info, feeds)
            self._run_options = shrink if memory_arena == "release" else None
            self.intra_op_threads = intra_op_threads
            self.warmup = WarmupReport(load_seconds, tuple(runs), tuple(wide_runs))
            if memory_arena == "release":
                trim_heap()
            self.headroom = headroom_mb * MB
            self.limit = anonymous_bytes() + self.headroom if memory_arena == "auto" else 0
        return self.warmup

    def describe_arena(self) -> str:
        """For the worker's ready line."""
        if self.arena == "release":
            return "released after each run"
        if self.arena == "auto":
            return f"kept, given back past +{self.headroom // MB} MB"
        return "kept"

    @property
    def ready(self) -> bool:
        return self._session is not None

    @property
    def info(self) -> ModelInfo | None:
        return self._info

    def infer(
        self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run the model; returns outputs by name (all outputs when output_names is None)."""
        session, info = self._session, self._info
        if session is None or info is None:
            raise RuntimeError("model is not loaded in this process")
        names = list(output_names) if output_names else [o.name for o in info.outputs]
        seat, wide = self._seat, self._wide
        with self.occupied():  # marked before the choice: two workers choosing at once both stay narrow
            threads = seat.threads() if seat is not None and wide is not None else 0
            if wide is not None and threads:
                session = wide
            with self._lock:
                self._ran = True
                self.last_wide = threads
                try:
                    results = session.run(names, dict(feeds), self._run_options)
                except _invalid_argument() as exc:  # the caller's feeds, not a fault of ours: a 400 naming the input
                    raise refused_feeds(info, feeds, str(exc)) from None
        return dict(zip(names, results, strict=True))

    @property
    def runs_wide(self) -> bool:
        """This worker has a wide session, and so a seat whose marks the model's other workers read."""
        return self._seat is not None

    def request_began(self, queued: bool = False) -> None:
        """The transport took a request (gunicorn's pre_request): marked working until `request_ended`.

        Wider than the data plane's mark: it covers the reply's writing too, so a worker between
        two requests under load looks idle only while it accepts and parses the next one.
        `queued`: more connections were waiting when it began; this worker runs it narrow.
        """
        if self._seat is not None:
            self._seat.enter(queued)

    def request_ended(self, queued: bool = False) -> None:
        if self._seat is not None:
            self._seat.leave(queued)

    def occupied(self) -> AbstractContextManager[None]:
        """Mark this worker working on the pool's board for the block (a request, an inference).

        While it is marked, no other worker of the model starts a wide run on its cores.
        """
        return self._seat.working() if self._seat is not None else nullcontext()

    def give_back(self) -> None:
        """After a request (post_request, once its arrays are gone): bound what the load leaves behind.

        "release": trim the C heap (each run shrank the arena into it). "auto": past the limit,
        give the arena and the heap's free pages back. Not done inside `infer`: the outputs
        still held there are arena memory, and the arena frees only regions that are wholly
        free. Reading statm costs microseconds; a release (a warm-up sized run that shrinks the
        arena at its end, then malloc_trim) about one small run, and happens only past the
        limit. What could not be given back raises the limit, so a worker that keeps more
        for good (Python's own heap, the tokenizer's caches) is not released after every request.
        A request that ran nothing (shed, refused before inference) left the arena as it was and
        is not checked; what it grew of Python's heap is seen at the next run's check.
        """
        session = self._session
        if session is None or self.arena == "keep" or not self._ran:
            return  # no run since the last check: the statm read (~10 % of a shed 503's cost) is saved
        with self._lock:
            self._ran = False
            if self.arena == "release":
                trim_heap()
                return
            if anonymous_bytes() <= self.limit:
                return
            if self._idle_feeds is not None:
                for each in (session, self._wide):  # each session has an arena of its own
                    if each is not None:
                        each.run(None, self._idle_feeds, self._shrink)
            else:  # string inputs: no run of our own; every run shrinks the arena from now on
                self._run_options = self._shrink
            trim_heap()
            self.releases += 1
            self.limit = max(self.limit, anonymous_bytes() + self.headroom)


def _invalid_argument() -> type[Exception]:
    """onnxruntime's INVALID_ARGUMENT (a feed's shape, rank or type), imported where sessions run."""
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    return InvalidArgument  # type: ignore[no-any-return]


# The one runtime of this process. post_fork fills it in each worker; the
# master's copy stays empty (no onnxruntime session may exist there at fork).
RUNTIME = SessionRuntime()
