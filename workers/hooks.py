"""Bodies of the gunicorn hooks; `gunicorn.conf.py` calls each in one line.

Process rules (why things happen where they do):
- master, at config load: settings and model are validated (the model in a
  subprocess) and the core layout is planned. No onnxruntime session exists in
  the master, so nothing with a thread pool crosses a fork.
- master, `pre_fork`: the new worker is given a slot (a disjoint core share).
- worker, `post_fork`: pin to the slot's cores, build the ONE session with
  intra-op threads = share size, warm it up; only then gunicorn's worker loop
  starts accepting requests, so a worker never serves cold.
- master, `child_exit`: the slot is freed for the replacement; the dead
  worker's live metric gauges are dropped and the restart is counted.

Metrics: `configure()` exports the per-run multiprocess folder on the first
load (`workers.metrics_dir`), before the preloaded app imports
prometheus_client; that is why `server.metrics` is only ever imported inside
the hook bodies below, never at the top of this module.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.loader import ConfigError, LoadedSettings, load_settings
from config.settings import Settings
from workers import metrics_dir
from workers.cores import Layout, cgroup_cpu_limit, plan_layout, usable_cores
from workers.logs import ACCESS_FORMAT, logconfig_dict
from workers.metrics_dir import MetricsDir
from workers.model_info import ModelInfo
from workers.model_probe import ModelError
from workers.preflight import preflight
from workers.session import RUNTIME
from workers.slots import SlotTable
from workers.snapshot import ModelSnapshots

log = logging.getLogger("onnxpool.workers")

__all__ = ["ACCESS_FORMAT", "configure", "pool"]

SLOT_ATTRIBUTE = "onnxpool_slot"


@dataclass
class Pool:
    """The master's view of the pool: settings, layout and who holds which slot."""

    loaded: LoadedSettings
    model: ModelInfo
    layout: Layout
    slots: SlotTable
    master_pid: int
    model_file: Path
    """The validated file new workers load (a private copy, see workers/snapshot.py)."""
    snapshots: ModelSnapshots
    metrics: MetricsDir | None = None

    @property
    def settings(self) -> Settings:
        return self.loaded.settings

    @property
    def logconfig(self) -> dict[str, Any]:
        return logconfig_dict(self.settings.logging)


_pool: Pool | None = None


def configure() -> Pool:
    """Load and validate everything in the master; called each time gunicorn reads its config.

    First load: any problem prints ONE line and exits non-zero before a worker
    is forked. Reload (HUP): a problem is logged and the running configuration
    is kept, so a typo never takes a serving master down.
    """
    global _pool
    snapshots = _pool.snapshots if _pool is not None else ModelSnapshots()
    try:
        loaded = load_settings()
        model, model_file = _validated_model(loaded.settings, snapshots)
    except (ConfigError, ModelError) as exc:
        if _pool is None:
            snapshots.remove()
            print(f"onnxpool: error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None
        log.error("reload: keeping the running configuration and the last good model: %s", exc)
        return _pool
    snapshots.promote(model_file)
    server = loaded.settings.server
    layout = plan_layout(usable_cores(), server.workers, server.threads_per_worker)
    # Keep the slot table across reloads: workers still running hold slots in it.
    keep = _pool is not None and _pool.slots.size == layout.slots
    slots = _pool.slots if keep and _pool is not None else SlotTable(layout.slots)
    # The metrics folder is per run: made once, kept across reloads (totals survive).
    metrics = _pool.metrics if _pool is not None else _prepare_metrics(loaded.settings)
    _pool = Pool(
        loaded=loaded,
        model=model,
        layout=layout,
        slots=slots,
        master_pid=os.getpid(),
        model_file=model_file,
        snapshots=snapshots,
        metrics=metrics,
    )
    return _pool


def _validated_model(settings: Settings, snapshots: ModelSnapshots) -> tuple[ModelInfo, Path]:
    """Copy the model, validate the copy; the copy is what workers will load.

    A model whose copy does not load on its own (external data files next to
    it) is validated and served from its configured path instead.
    """
    source = settings.model.path
    try:
        copy = snapshots.take(source)
    except FileNotFoundError:
        raise ModelError(f"model file {source} does not exist") from None
    except OSError as exc:
        raise ModelError(f"model file {source} cannot be read: {exc.strerror}") from None
    try:
        return preflight(settings, copy), copy
    except ModelError:
        snapshots.discard(copy)
    model = preflight(settings)  # raises the error about the real file if it is bad
    log.info("model %s does not load from a copy (external data?): workers load it in place", source)
    return model, source


def _prepare_metrics(settings: Settings) -> MetricsDir | None:
    try:
        return metrics_dir.prepare(settings.metrics)
    except OSError as exc:
        print(f"onnxpool: error: metrics.dir: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def pool() -> Pool:
    if _pool is None:
        raise RuntimeError("workers.hooks.configure() has not run")
    return _pool


def on_starting(server: Any) -> None:
    p = pool()
    layout, settings = p.layout, p.settings
    limit = cgroup_cpu_limit()
    log.info(
        "onnxpool: model %s (%s); usable cores %s (affinity %s, cgroup CPU limit %s) -> %d workers x %d threads",
        settings.model.name,
        settings.model.path,
        list(layout.cores),
        sorted(os.sched_getaffinity(0)),
        f"{limit:g}" if limit else "none",
        layout.workers,
        layout.threads,
    )
    _warn_if_oversubscribed(layout, layout.workers)
    if p.metrics is not None:
        log.info("metrics: GET /metrics sums the per-process files in %s", p.metrics.path)
    _publish_build_info(p, layout.workers)


def _publish_build_info(p: Pool, workers: int) -> None:
    if p.metrics is None:
        return
    from importlib.metadata import version

    from server import __version__, metrics

    # The version from the package metadata: importing onnxruntime in the master is not allowed.
    metrics.set_build_info(__version__, version("onnxruntime"), workers, p.layout.threads)


def _warn_if_oversubscribed(layout: Layout, workers: int) -> None:
    if workers * layout.threads > len(layout.cores):
        log.warning(
            "OVERSUBSCRIBED: %d workers x %d threads = %d threads on %d usable cores; "
            "workers will share cores and throughput drops. Set workers x threads_per_worker <= %d.",
            workers,
            layout.threads,
            workers * layout.threads,
            len(layout.cores),
            len(layout.cores),
        )


def pre_fork(server: Any, worker: Any) -> None:
    setattr(worker, SLOT_ATTRIBUTE, pool().slots.acquire(worker.age))


def post_fork(server: Any, worker: Any) -> None:
    p = pool()
    slot: int = getattr(worker, SLOT_ATTRIBUTE)
    cores = p.layout.core_share_for(slot)
    os.sched_setaffinity(0, cores)
    model = p.settings.model
    report = RUNTIME.load(
        p.model_file,
        intra_op_threads=len(cores),
        spin=p.settings.server.spin,
        optimization=model.graph_optimization_level,
        warmup_runs=model.warmup_runs,
        heartbeat=worker.notify,
    )
    runs = report.run_seconds
    log.info(
        "worker ready: slot=%d pid=%d cores=%s threads=%d model load %.0f ms, warm-up %d runs "
        "(first %.1f ms, last %.1f ms)",
        slot,
        os.getpid(),
        ",".join(map(str, cores)),
        RUNTIME.intra_op_threads,
        report.load_seconds * 1000,
        len(runs),
        runs[0] * 1000 if runs else 0.0,
        runs[-1] * 1000 if runs else 0.0,
    )
    if p.metrics is not None:
        from server import metrics

        metrics.worker_loaded(slot, report.load_seconds, sum(runs))


def child_exit(server: Any, worker: Any) -> None:
    p = pool()
    p.slots.release(worker.age)
    _forget_worker(p, worker.pid)


def _forget_worker(p: Pool, pid: int) -> None:
    """Master: drop a dead worker's live gauges (in-flight, load times); count the restart."""
    if p.metrics is not None:
        from server import metrics

        metrics.worker_exited(pid)


def worker_exit(server: Any, worker: Any) -> None:
    # Runs in the worker too (its last call); only the master's bookkeeping
    # matters. In the master it runs when gunicorn finds a worker already gone
    # (ESRCH), where child_exit is skipped, so the slot must be freed here too.
    # (Workers exit normally: the master never imports onnxruntime, so no
    # thread of it was half-copied into them by fork; see workers/session.py.)
    p = _pool
    if p is not None and os.getpid() == p.master_pid:
        p.slots.release(worker.age)
        _forget_worker(p, worker.pid)


def nworkers_changed(server: Any, new_value: int, old_value: int | None) -> None:
    # TTIN/TTOU or gunicornc can change the count at runtime: slots already wrap
    # around the shares; say so loudly if that now oversubscribes the cores.
    if old_value is not None:
        log.info("worker count changed: %s -> %s", old_value, new_value)
        _warn_if_oversubscribed(pool().layout, new_value)
    if _pool is not None:
        _publish_build_info(_pool, new_value)


def on_exit(server: Any) -> None:
    # Master, last thing before it exits: remove this run's metrics folder.
    if _pool is not None:
        metrics_dir.remove(_pool.metrics)
        _pool.snapshots.remove()
