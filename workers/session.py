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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from onnxpool.workers.cpu_fit import METADATA_PREFIX
from onnxpool.workers.model_info import ModelInfo, TensorSpec, static_shape

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


def build_session(
    model_path: Path, intra_op_threads: int, spin: bool = False, optimization: str = "all"
) -> ort.InferenceSession:
    """One CPU session with EXPLICIT thread counts.

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
    options.log_severity_level = 3  # errors only: warnings about unused initialisers are noise
    return ort.InferenceSession(
        str(model_path),
        sess_options=options,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=list(DISABLED_OPTIMIZERS),
    )


@dataclass(frozen=True)
class WarmupReport:
    """Timings of the model load and the warm-up runs, for logs and metrics."""

    load_seconds: float
    run_seconds: tuple[float, ...]

    @property
    def total_seconds(self) -> float:
        return self.load_seconds + sum(self.run_seconds)


def warm_up(session: ort.InferenceSession, runs: int, heartbeat: Callable[[], None] | None = None) -> list[float]:
    """Run `runs` inferences on zeros so the first real request is not the slow one."""
    info = model_info_of(session)
    feeds = {}
    for spec in info.inputs:
        dtype = spec.dtype
        if dtype is None:
            return []  # string inputs: nothing sensible to synthesise
        feeds[spec.name] = np.zeros(static_shape(spec), dtype=dtype)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
        if heartbeat is not None:
            heartbeat()
    return times


ArenaMode = Literal["auto", "keep", "release"]


def releases_arena(mode: ArenaMode, info: ModelInfo) -> bool:
    """Should each run give its arena memory back? (`[model] memory_arena`)

    onnxruntime's CPU arena grows to the largest run and keeps that memory for the next one.
    With fixed shapes every run needs the same, so keeping it is free speed. With a dynamic
    dimension besides the batch (tokens), one long request would pin its memory in every
    worker for good: "auto" releases it then.
    """
    if mode != "auto":
        return mode == "release"
    return any(d < 0 for spec in info.inputs for d in spec.shape[1:])


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
        self.releases_arena = False
        self._run_options: ort.RunOptions | None = None

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
    ) -> WarmupReport:
        """Build the session and warm it up; the runtime is ready when this returns."""
        import onnxruntime as ort  # in the worker, after fork (module comment above)

        start = time.perf_counter()
        session = build_session(model_path, intra_op_threads, spin, optimization)
        load_seconds = time.perf_counter() - start
        runs = warm_up(session, warmup_runs, heartbeat)
        info = model_info_of(session)
        release = releases_arena(memory_arena, info)
        run_options = None
        if release:
            run_options = ort.RunOptions()
            run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        with self._lock:
            self._session, self._info = session, info
            self._run_options, self.releases_arena = run_options, release
            self.intra_op_threads = intra_op_threads
            self.warmup = WarmupReport(load_seconds, tuple(runs))
        return self.warmup

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
        with self._lock:
            results = session.run(names, dict(feeds), self._run_options)
        return dict(zip(names, results, strict=True))


# The one runtime of this process. post_fork fills it in each worker; the
# master's copy stays empty (no onnxruntime session may exist there at fork).
RUNTIME = SessionRuntime()
