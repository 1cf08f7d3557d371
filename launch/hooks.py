"""Bodies of the gunicorn hooks: the one place where the worker pool and the HTTP app meet.

`launch/gunicorn_conf.py` calls each in one line. Process rules (why things
happen where they do; docs/ARCHITECTURE.md):
- master, each config load (start and every HUP), `configure()`: settings are
  loaded and validated ONCE, the model is validated (in a subprocess, from a
  private copy), the core layout is planned, and the Flask app is built from
  those same settings (labels, preprocessing, limits, API keys). Together they
  are one generation. At start any problem is one line and exit 1; on HUP it is
  logged and the running generation stays. No onnxruntime session exists in the
  master, so nothing with a thread pool crosses a fork.
- master, `pre_fork`: the new worker is given a slot (a disjoint core share).
- worker, `post_fork`: pin to the slot's cores when the layout is pinned (the
  cores are the process's own; not when the affinity mask is wider than the
  cgroup quota, workers/cores.py), build the ONE session with intra-op threads
  = share size, warm it up, open the response cache (its own LMDB environment
  or Redis client: none may cross fork, so the master only creates the local
  cache's files) and serve the generation's app; only then
  gunicorn's worker loop starts accepting requests. Its last step says "warm"
  to the master (`say_warm`: a mode bit of its gunicorn heartbeat file).
- master, HUP (`hand_over_on_reload`, installed in `on_starting`): gunicorn forks
  the new generation and would SIGTERM the old one at once; the old workers
  keep serving until every new worker is warm (at most server.graceful_timeout).
- worker, `post_request`: a connection that closes after its reply, with the
  request read to its end, is closed without waiting for the client's FIN.
- master, `child_exit`: the slot is freed for the replacement; the dead
  worker's live metric gauges are dropped and the restart is counted.
- worker, `worker_exit` (a graceful exit: TERM, a HUP's replacement, max_requests):
  the task's `finish` releases what its `start_in_worker` made; an error is logged.

Import order matters once: prometheus_client chooses its multiprocess storage
when it is first imported, from $PROMETHEUS_MULTIPROC_DIR, which the master
exports while making its run folder. The HTTP layer imports prometheus_client,
so this module imports `onnxpool.server` only inside functions that run after
the first `configure()` has exported the folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gunicorn.http.body import LengthReader

from onnxpool import drain, wire
from onnxpool.config.callers import CallerBook, caller_book_of, lane_addresses
from onnxpool.config.loader import ENV_HOST_DIR, ENV_POOL, ConfigError, load_settings
from onnxpool.config.settings import Settings
from onnxpool.host.priority import apply_nice
from onnxpool.host.state import pool_error_file, read_host, write_pool_description, write_pool_reloads
from onnxpool.server.callers import lane_of
from onnxpool.tasks.registry import build_task, why_chosen
from onnxpool.workers.cores import Layout
from onnxpool.workers.cpu_fit import ModelRecipe
from onnxpool.workers.handoff import Handoff
from onnxpool.workers.lane_worker import HANDOFF_ATTRIBUTE, LANES_ATTRIBUTE, LaneWorker
from onnxpool.workers.lanes import LanePlan
from onnxpool.workers.memory import MemoryProbe, ProcessMemory, read_memory
from onnxpool.workers.pool import Generation, Pool
from onnxpool.workers.preflight import ModelError
from onnxpool.workers.run_folder import RunFolder
from onnxpool.workers.session import RUNTIME
from onnxpool.workers.wide import Seat, describe_setting, plan_wide

if TYPE_CHECKING:
    import numpy as np
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment
    from flask import Flask

    from onnxpool.tasks.rehearsal import AnyTask, Rehearsal

log = logging.getLogger("onnxpool.workers")

SLOT_ATTRIBUTE = "onnxpool_slot"
SEAT_ATTRIBUTE = "onnxpool_seat"
"""The worker's seat on its pool's board (workers/lanes.py): lanes and wide runs read it."""


@dataclass(frozen=True)
class Serving:
    """The generation in force and the app built from its settings."""

    pool: Pool
    generation: Generation
    app: Flask
    callers: CallerBook
    identity: tuple[object, ...] = ()
    """What its workers serve (`_identity`): a HUP that reads the same one forks no new workers."""
    warmup_feeds: dict[str, np.ndarray] | None = None
    """What the task's own sample request fed the model in the master (`onnxpool.tasks.rehearsal`):
    every worker warms up on it (None: the task has no sample; workers warm up on zeros)."""
    rehearsed: str = ""
    """The line saying how the sample request went (logged with the task's at start, at once on a HUP)."""

    @property
    def binds(self) -> list[str]:
        """gunicorn's listeners: [server] bind (lane 0), then the callers' lanes bound at start (workers/lanes.py).
        Never another list at a HUP: gunicorn would close the sockets the old workers still serve on."""
        bind = self.settings.server.bind
        return [bind, *lane_addresses(bind, self.pool.lanes_bound(self.callers))]

    @property
    def worker_class(self) -> str:
        """The sync worker that chooses between callers' lanes and runs gRPC's calls in turn with HTTP
        (gthread workers take lanes in turn, and serialise gRPC's calls with the session's lock)."""
        server = self.settings.server
        if server.worker_class == "sync" and (self.pool.lanes_bound(self.callers) or server.grpc_bind):
            return f"{LaneWorker.__module__}.{LaneWorker.__qualname__}"
        return server.worker_class

    def lane_plan(self) -> LanePlan | None:
        """What the workers choose by: the callers' weights on the lanes bound at start (None: no choice)."""
        bound = self.pool.lanes_bound(self.callers)
        if not bound or not self.callers.lane_count:
            return None
        weights = (*self.callers.lane_weights(), *([1] * bound))[: bound + 1]
        return LanePlan(weights, self.layout.workers, self.callers.settings.hold_ms / 1000)

    @property
    def settings(self) -> Settings:
        return self.generation.settings

    @property
    def layout(self) -> Layout:
        return self.generation.layout


class GenerationApp:
    """The WSGI callable gunicorn preloads: serves the app of the generation this worker was forked in.

    gunicorn preloads the WSGI app once and keeps it across HUP, so the app
    built for each generation is handed over here in post_fork instead. It also
    corks the client socket when the reply starts (onnxpool.wire: headers and body
    in one segment); `post_request` uncorks it.
    """

    def __init__(self) -> None:
        self.current: WSGIApplication | None = None

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if self.current is None:  # only reachable outside gunicorn, before configure()
            raise RuntimeError("onnxpool.hooks.configure() has not run")

        def reply(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            wire.cork(environ)  # headers and body leave together; post_request uncorks
            return start_response(status, headers, exc_info)

        return self.current(environ, reply)


WSGI_APP = GenerationApp()
_serving: Serving | None = None
_unchanged = False
"""Set by a reload's `configure()` that read what is served: that reload forks no workers."""
_opened: Flask | None = None
_settle_log: Callable[[], None] | None = None
"""Worker: puts what the request just answered left for the inference log into its buffer (post_request)."""
"""Worker: the app whose task `start_in_worker` has run here (its `finish` runs in worker_exit)."""


def configure() -> Serving:
    """Load and validate one generation in the master; called each time gunicorn reads its config."""
    global _serving
    pool = _serving.pool if _serving is not None else None
    try:
        loaded = load_settings()
        if pool is None:
            pool = _start_pool(loaded.settings)
        generation = pool.validate(loaded)
        try:
            callers = callers_of(generation.settings)
            app, identity, task = _build_app(generation, pool, callers)
            unchanged = _serving is not None and identity == _serving.identity
            rehearsal, rehearsed = (None, "") if unchanged else _rehearse(task, generation)
        except ConfigError:  # the task (its table, its check of the model), labels or API keys file, cache folder
            pool.reject(generation)
            raise
    except (ConfigError, ModelError) as exc:
        if _serving is None and pool is not None:
            pool.run.remove()  # nothing was forked: leave no folder behind
        return _refuse(exc)
    if unchanged and _serving is not None:
        global _unchanged
        _unchanged = True  # this HUP forks no workers (serve_on_when_unchanged)
        pool.reject(generation)  # its model copy goes; the running workers' stays
        log.info("reload: the settings, task, keys and model read are the ones served: the workers serve on")
        return _serving
    pool.adopt(generation)
    if _serving is not None:
        log.info("reload: new workers serve the re-read settings and model %s", generation.settings.model.path)
        if generation.model_choice:
            log.info("%s", generation.model_choice)
        _warn_cpu_fit(generation)
    reloaded = _serving is not None
    feeds = rehearsal.feeds if rehearsal is not None else None
    _serving = Serving(
        pool=pool,
        generation=generation,
        app=app,
        callers=callers,
        identity=identity,
        warmup_feeds=feeds,
        rehearsed=rehearsed,
    )
    if reloaded:  # the first load's lines are logged in on_starting, once gunicorn's logging is set up
        if rehearsed:
            log.info("reload: %s", rehearsed)
        _log_task_lines(task)
        _log_callers(_serving)
    return _serving


def _refuse(exc: Exception) -> Serving:
    """First load: one line on stderr, exit 1 before any fork. Reload: log, keep serving what runs."""
    if _serving is None:
        host, pool = host_dir(), os.environ.get(ENV_POOL, "")
        if host is not None and pool:
            # One model of several: its reason in the host's files (the model lists show it).
            with contextlib.suppress(OSError):
                pool_error_file(host, pool).write_text(f"{exc}\n", encoding="utf-8")
        if not (host is not None and pool and os.environ.get(UNDER_HOST_SUPERVISOR)):
            # Under the host's supervisord the host says it, once (supervisord starts a failing pool more
            # than once); in a container of its own (a pod's model) the container's log is where it is read.
            print(f"onnxpool: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    log.error("reload: keeping the running configuration and the last good model: %s", exc)
    return _serving


UNDER_HOST_SUPERVISOR = "SUPERVISOR_ENABLED"
"""Set by supervisord in its programs' environment."""


def _start_pool(settings: Settings) -> Pool:
    """First load only: the run folder (exports the metrics folder before prometheus_client loads)."""
    try:
        run = RunFolder.create(settings.server.run_dir)
    except OSError as exc:
        raise ConfigError(f"server.run_dir: cannot create a run folder in {exc.filename}: {exc.strerror}") from None
    try:
        run.export_metrics(settings.metrics)
    except OSError as exc:
        run.remove()
        raise ConfigError(f"metrics.dir: {exc}") from None
    return Pool(run)


def callers_of(settings: Settings) -> CallerBook:
    """The callers of these settings; ConfigError names a mistake (a lane past port 65535 too)."""
    book = caller_book_of(settings)
    try:
        lane_addresses(settings.server.bind, book.lane_count)
    except ValueError as exc:
        raise ConfigError(f"server.bind: {exc}") from None
    return book


def _log_callers(s: Serving) -> None:
    callers = s.callers
    bound = s.pool.lanes_bound(callers)
    if callers.lane_count != bound:
        log.warning(
            "callers: %d lanes were bound at start and this file asks for %d: restart to apply "
            "(a HUP keeps the listening sockets); %s",
            bound,
            callers.lane_count,
            "until then every caller waits in one queue" if not bound else "callers past them share lane 0",
        )
    if not callers.enabled:
        return
    if s.worker_class != s.settings.server.worker_class:
        log.info(
            "callers by %s: %s; each on its lane (%s), a model's workers shared between the active ones by weight",
            callers.settings.identify,
            ", ".join(f"{c.name} (lane {c.lane})" for c in callers.callers) or "none named yet",
            ", ".join(s.binds[1:]),
        )
    else:
        log.warning(
            "callers by %s are named in logs and metrics, but gthread workers take their requests in "
            'arrival order: a model is shared fairly between callers only with worker_class = "sync"',
            callers.settings.identify,
        )
    if not s.settings.nginx.pidfile and host_dir() is None:
        log.warning(
            "callers are kept apart only behind onnxpool's nginx (it sends each caller to its lane and "
            "holds its quota): `onnxpool nginx-config` or `onnxpool nginx`; requests sent here directly "
            "all wait in one queue"
        )


def _rehearse(task: AnyTask, generation: Generation) -> tuple[Rehearsal | None, str]:
    """Master, before any fork: the task answers its own sample request on the model file workers will
    load, end to end (`onnxpool.tasks.rehearsal`); a misfit is a TaskConfigError: the start stops, a HUP
    keeps the last good model. With the line that says how it went."""
    from onnxpool.tasks.rehearsal import rehearse

    model = generation.settings.model
    start = time.monotonic()
    rehearsal = rehearse(task, generation.model_file, model.graph_optimization_level, model.prepacking)
    if rehearsal is None:
        return None, ""
    line = (
        f"task {task.name} answered its own sample request (POST {rehearsal.route}) on the model in "
        f"{time.monotonic() - start:.2f} s; workers warm up on its feeds"
    )
    return rehearsal, line


def _build_app(generation: Generation, pool: Pool, callers: CallerBook) -> tuple[Flask, tuple[object, ...], AnyTask]:
    """The generation's app, what it serves (`_identity`), and its task."""
    from onnxpool.server.app import CachePlan, create_app  # after the metrics folder is exported (module doc)
    from onnxpool.tasks.identity import task_identity

    settings = generation.settings
    # The task, built and bound to the model here, before any fork: its class imported and checked,
    # its [task] table validated, its files read, its inputs and outputs matched to the model's.
    for line in generation.loaded.warnings:
        log.warning("%s", line)
    task = build_task(generation.loaded, generation.model)
    plan = CachePlan(model_digest=generation.model_digest, folder=_prepare_cache(settings, pool))
    app = create_app(settings, RUNTIME, plan, task, callers)
    host = host_dir()
    if host is not None:  # one model of several: the host routes to its task's routes and lists its API
        from onnxpool.server.auth import AUTH_KEY
        from onnxpool.server.openapi import openapi_document

        document = openapi_document(settings, task, auth=AUTH_KEY in app.extensions)
        write_pool_description(host, settings.model.name, task.routes, document, pool.lanes_bound(callers))
    identity = (
        settings,
        generation.model_digest,
        generation.layout,
        task_identity(task),  # its code, the files its settings name (labels...), what it read
        callers,  # the keys file's callers and quotas
        _host_nice(settings),
    )
    return app, identity, task


def host_dir() -> Path | None:
    """The run folder of the host this master is one pool of (several models), else None."""
    value = os.environ.get(ENV_HOST_DIR)
    return Path(value) if value else None


def _host_nice(settings: Settings) -> int:
    """This model's nice value in the host's plan (0 on a one-model server, or with a cgroup)."""
    host = host_dir()
    if host is None:
        return 0
    model = read_host(host).model(settings.model.name)
    return model.nice if model is not None else 0


def _prepare_cache(settings: Settings, pool: Pool) -> Path | None:
    """Master, before forking: the local cache's files (`onnxpool.cache.policy.prepare`), kept across HUP.

    Only files are made here; every worker opens its own connection after fork.
    """
    from onnxpool.cache.policy import CacheSetupError, prepare

    section = settings.cache
    if not section.enabled or section.url:
        return None
    folder = pool.run.cache
    try:
        prepare(section, folder)
    except CacheSetupError as exc:
        raise ConfigError(f"cache: {exc}") from None
    return folder


def _log_task(s: Serving) -> None:
    from onnxpool.server.app import task_of  # loaded with the app already

    task = task_of(s.app)
    asked = s.settings.model.task
    why = f" (auto: {why_chosen(s.generation.model)})" if asked == "auto" else ""
    log.info("task: %s%s; routes: %s", task.name, why, ", ".join(f"POST {rule}" for rule in task.routes))
    if s.rehearsed:
        log.info("%s", s.rehearsed)
    _log_task_lines(task)
    if not task.caches_replies():
        log.info("task %s: replies are never cached (the task defines no canonical bytes)", task.name)


def _log_task_lines(task: AnyTask) -> None:
    """What the task settled from the model (the scores it applies and why...), at start and at each HUP."""
    for line in task.startup_lines():
        log.info("task %s: %s", task.name, line)


def serving() -> Serving:
    if _serving is None:
        raise RuntimeError("onnxpool.hooks.configure() has not run")
    return _serving


def on_starting(server: Any) -> None:
    s = serving()
    layout, settings = s.layout, s.settings
    quota = layout.allowance.quota
    log.info(
        "onnxpool: model %s (%s); cpu: %s; affinity %s, cgroup CPU limit %s -> %d workers x %d threads; %s",
        settings.model.name,
        settings.model.path,
        layout.cpu_mode,
        _core_list(layout.cores),
        f"{quota:g}" if quota is not None else "none",
        layout.workers,
        layout.threads,
        describe_setting(layout, settings.model.wide_threads),
    )
    if s.generation.model_choice:
        log.info("%s", s.generation.model_choice)
    links = s.generation.loaded.service_links_line()
    if links:  # at start only: the master's environment is the same at every HUP, a reload would repeat it
        log.info("%s", links)
    _warn_if_oversubscribed(layout, layout.workers)
    _log_task(s)
    _log_callers(s)
    if settings.nginx.pidfile:
        drain.hold_term_for_proxy(server, Path(settings.nginx.pidfile), settings.server.graceful_timeout)
    _warn_cpu_fit(s.generation)
    log.info("run folder: %s", s.pool.run.path)
    if s.pool.run.metrics is not None:
        log.info("metrics: GET /metrics sums the per-process files in %s", s.pool.run.metrics)
    _publish_build_info(s, layout.workers)
    hand_over_on_reload(server)
    serve_on_when_unchanged(server)


def _core_list(cores: tuple[int, ...]) -> str:
    """Core ids as ranges ("0-63" rather than 64 numbers) for log lines."""
    ranges: list[str] = []
    for core in cores:
        if ranges and ranges[-1].rpartition("-")[2] == str(core - 1):
            ranges[-1] = f"{ranges[-1].partition('-')[0]}-{core}"
        else:
            ranges.append(str(core))
    return ",".join(ranges) or "none"


def _warn_cpu_fit(generation: Generation) -> None:
    """One line when the model's INT8 recipe does not fit this CPU (cpu_mismatch = "warn" serves it)."""
    if not generation.cpu_fit.ok:
        log.warning("CPU MISMATCH: %s: %s", generation.settings.model.path, generation.cpu_fit.message)


def _publish_build_info(s: Serving, workers: int) -> None:
    if s.pool.run.metrics is None:
        return
    from importlib.metadata import version

    from onnxpool import __version__
    from onnxpool.server import metrics

    # The version from the package metadata: importing onnxruntime in the master is not allowed.
    metrics.set_build_info(__version__, version("onnxruntime"), workers, s.layout.threads)
    recipe = ModelRecipe.from_metadata(s.generation.model.metadata_map)
    metrics.set_model_cpu_fit(s.settings.model.name, recipe.target if recipe else "", s.generation.cpu_fit.label)


def _warn_if_oversubscribed(layout: Layout, workers: int) -> None:
    if workers * layout.threads > layout.cpus:
        log.warning(
            "OVERSUBSCRIBED: %d workers x %d threads = %d threads on %d usable CPUs; "
            "workers will share cores and throughput drops. Set workers x threads_per_worker <= %d.",
            workers,
            layout.threads,
            workers * layout.threads,
            layout.cpus,
            layout.cpus,
        )


def pre_fork(server: Any, worker: Any) -> None:
    s = serving()
    setattr(worker, SLOT_ATTRIBUTE, s.pool.slots.acquire(worker.age))
    seat = s.pool.seats.acquire(worker.age)  # every worker: the board says who is working (wide runs)
    setattr(worker, SEAT_ATTRIBUTE, seat)
    plan = s.lane_plan()
    if plan is not None:
        setattr(worker, LANES_ATTRIBUTE, (s.pool.seats.board, seat, plan))


def post_fork(server: Any, worker: Any) -> None:
    s = serving()
    slot: int = getattr(worker, SLOT_ATTRIBUTE)
    layout = s.layout
    if layout.pinned:
        cores = ",".join(map(str, layout.core_share_for(slot)))
        os.sched_setaffinity(0, layout.core_share_for(slot))
    else:  # the mask is wider than the quota: other pods' cores; let the kernel place us
        cores = f"unpinned ({_core_list(layout.cores)})"
    # One model of several without a cgroup: its budget is this worker's weight (host/budget.py).
    nice = _host_nice(s.settings)
    apply_nice(nice)
    model = s.settings.model
    # A wide session beside the narrow one: its threads on the other workers' cores (workers/wide.py).
    wide = plan_wide(layout, model.wide_threads, slot)
    # No plan here means none in any worker of the model (same layout, same setting): nobody reads
    # the board's marks, so none are made (a seat, a select on the listeners per request).
    seat = Seat(s.pool.seats.board, getattr(worker, SEAT_ATTRIBUTE), wide) if wide is not None else None
    report = RUNTIME.load(
        s.generation.model_file,
        intra_op_threads=layout.share_size,
        spin=s.settings.server.spin,
        optimization=model.graph_optimization_level,
        warmup_runs=model.warmup_runs,
        heartbeat=worker.notify,
        memory_arena=model.memory_arena,
        headroom_mb=model.memory_headroom_mb,
        prepacking=model.prepacking,
        seat=seat,
        feeds=s.warmup_feeds,
    )
    from onnxpool.server.app import inference_log_settle, open_in_worker

    global _opened, _settle_log
    # The task's thread pools, the response cache's connection, the inference log's shipper thread:
    # this worker's own, never the master's.
    open_in_worker(s.app, layout.share_size)
    _opened = s.app
    _settle_log = inference_log_settle(s.app)
    wire.cache_http_date()
    WSGI_APP.current = s.app  # this worker serves the generation it was forked in
    runs = report.run_seconds
    memory = read_memory()
    log.info(
        "worker ready: slot=%d pid=%d cores=%s threads=%d wide=%s nice=%d arena=%s model load %.0f ms, "
        "warm-up %d runs (first %.1f ms, last %.1f ms)%s; memory after warm-up: %s",
        slot,
        os.getpid(),
        cores,
        RUNTIME.intra_op_threads,
        wide.describe() if wide is not None else "off",
        os.getpriority(os.PRIO_PROCESS, 0),
        RUNTIME.describe_arena(),
        report.load_seconds * 1000,
        len(runs),
        runs[0] * 1000 if runs else 0.0,
        runs[-1] * 1000 if runs else 0.0,
        f", wide {len(report.wide_run_seconds)} runs (last {report.wide_run_seconds[-1] * 1000:.1f} ms)"
        if report.wide_run_seconds
        else "",
        memory.describe(),
    )
    if s.pool.run.metrics is not None:
        from onnxpool.server import metrics

        metrics.worker_loaded(slot, report.load_seconds, report.total_seconds - report.load_seconds)
        _publish_memory(s, memory)


def post_worker_init(worker: Any) -> None:
    """Worker, once gunicorn has set it up (its wake-up pipe, signals), right before it serves: gRPC on
    `[server] grpc_bind` when set, then "warm" to the master (from here on the master may stop the workers
    this one replaces, so a HUP's new workers listen for gRPC before the old ones stop)."""
    s = serving()
    if s.settings.server.grpc_bind:
        _serve_grpc(s, worker)
    say_warm(worker)


_grpc: Any = None
"""Worker: its gRPC server when no handoff stops it (gthread workers; `worker_exit` does)."""


def _serve_grpc(s: Serving, worker: Any) -> None:
    # Imported here, in the worker: gRPC's threads and pollers must never exist in the master (fork).
    from onnxpool.server import grpc_server

    global _grpc
    app = WSGI_APP.current
    assert app is not None

    def answered(call: Callable[[], Any], queued: Callable[[], bool] = lambda: False) -> Any:
        # What pre_request and post_request do around an HTTP request: working on the board (wide
        # runs: narrow when more is waiting), then the memory checks after the reply.
        waiting = queued() if RUNTIME.runs_wide else False
        RUNTIME.request_began(waiting)
        try:
            return call()
        finally:
            RUNTIME.request_ended(waiting)
            if _settle_log is not None:
                _settle_log()  # the call's reply is made; the gRPC thread sends it meanwhile
            RUNTIME.give_back()
            _publish_memory(s, _MEMORY.due())

    if isinstance(worker, LaneWorker):  # sync: the calls run in the worker's main thread, in turn with HTTP
        handoff = Handoff(worker.PIPE[1])
        setattr(worker, HANDOFF_ATTRIBUTE, handoff)
        bound = s.pool.lanes_bound(s.callers) if s.lane_plan() is not None else 0

        def more_waiting() -> bool:
            return handoff.pending or _connections_waiting(worker)

        def in_main_thread(call: Callable[[], Any], environ: WSGIEnvironment) -> Any:
            lane = lane_of(s.callers, bound, environ) if bound else 0  # the fair choice's, as for a connection
            return handoff.submit(lambda: answered(call, more_waiting), lane)

        server = grpc_server.start(s.settings, app, in_main_thread)
        handoff.transports.append(server)
    else:  # gthread: request threads already take turns on the session's lock; so do gRPC's
        _grpc = grpc_server.start(s.settings, app, lambda call, _environ: answered(call))
    log.info("gRPC: worker pid=%d listening on %s", os.getpid(), s.settings.server.grpc_bind)


# How a worker tells the master it is warm: the owner-execute bit of its gunicorn heartbeat file.
# The master creates that file (open, already unlinked) before the fork and keeps its own
# descriptor; the worker has the same inode open. So the worker can set a bit with fchmod and the
# master read it with fstat: one syscall each, no path, nothing to clean up (it goes with the
# worker), never mistaken for another worker reusing the pid, no pipe or thread crossing fork.
# gunicorn itself only ever changes the file's times (the heartbeat), never its mode.
WARM_BIT = stat.S_IXUSR
HANDOVER_POLL_SECONDS = 0.05


def say_warm(worker: Any) -> None:
    """Worker, the end of post_fork: mark this worker warm for the master (`is_warm`)."""
    fd = worker.tmp.fileno()
    os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) | WARM_BIT)


def is_warm(worker: Any) -> bool:
    """Master: the worker has finished post_fork (model loaded, warmed up, app in place)."""
    try:
        return bool(os.fstat(worker.tmp.fileno()).st_mode & WARM_BIT)
    except (OSError, ValueError):  # its file already closed: reaped meanwhile
        return False


def hand_over_on_reload(server: Any) -> None:
    """Master: wrap the gunicorn Arbiter's `manage_workers` so a HUP stops the old workers only once the new are warm.

    gunicorn's `reload()` forks a full new set of workers and then calls `manage_workers()`,
    which SIGTERMs the oldest workers beyond `num_workers` at once: while the new ones load and
    warm up (post_fork), nobody accepts, requests wait in the listen backlog and, past
    `[limits] max_queue_ms`, are shed. Here, when there are more workers than `num_workers`,
    the newest `num_workers` are waited for first. A normal start or a dead worker's
    replacement (fewer workers than `num_workers`) is not slowed down.

    Process rules: this runs in the master's main loop (inside `reload()`), so while it waits
    the master handles no signal (a TERM or another HUP is handled right after, as gunicorn
    queues them) and murders no stuck worker; so the wait is bounded by server.graceful_timeout,
    after which one warning line and gunicorn's usual reload go on. It reaps dead children while
    it waits: a new worker that dies is no longer waited for (and one that fails to boot stops
    the server, as in gunicorn's own loop).
    """
    original: Callable[[], None] = server.manage_workers

    def manage_workers() -> None:
        by_age = sorted(server.WORKERS.values(), key=lambda w: w.age)
        excess = len(by_age) - server.num_workers
        limit = float(server.cfg.graceful_timeout)
        if excess <= 0 or limit <= 0:  # a start or a replacement; or graceful_timeout = 0: gunicorn's own way
            original()
            return
        newest = by_age[excess:]
        _wait_until_warm(server, newest, limit)
        # gunicorn stops the oldest workers beyond num_workers. If a new worker died meanwhile, an
        # old one would be left in the count and keep serving the old generation for good: stop
        # it too, so the next round forks a replacement of the new generation in its place.
        by_age = sorted(server.WORKERS.values(), key=lambda w: w.age)
        excess = len(by_age) - server.num_workers
        left = [w.pid for w in by_age[max(excess, 0) :] if w.age < newest[0].age]
        original()
        for pid in left:
            log.info("reload: a new worker died while warming up; stopping old worker %d too", pid)
            server.kill_worker(pid, signal.SIGTERM)

    server.manage_workers = manage_workers


def serve_on_when_unchanged(server: Any) -> None:
    """Master: a HUP whose config load read exactly what is served (`Serving.identity`) forks no workers.

    gunicorn's `reload()` forks a full new set of workers and stops the old one: for a file that changed
    nothing of this pool (a several-models host HUPs every pool; an operator's reflex HUP) that is every
    worker's warm-up for nothing. The running workers serve the same settings, task and model, so the
    spawning is skipped for that one reload (`_unchanged`, set by `configure()`); a worker that dies later is
    replaced as ever.

    The rest of gunicorn's `reload()` is skipped too: after `manage_workers()` it waits, up to
    graceful_timeout, for every worker older than the reload to exit. None does when none was replaced, so
    the master would sit out the whole graceful_timeout in that loop, handling no signal (a TERM, the next
    HUP) and replacing no dead worker. `manage_workers` ends the reload there instead (`_ServedOn`).
    """
    spawn: Callable[[], Any] = server.spawn_worker
    reload: Callable[[], None] = server.reload
    manage: Callable[[], None] = server.manage_workers

    def spawn_worker() -> Any:
        return None if _unchanged else spawn()

    def manage_workers() -> None:
        manage()
        if _unchanged:  # only ever True inside reload(): what follows there is the wait for old workers
            raise _ServedOn

    def reload_once() -> None:
        global _unchanged, _reloads
        try:
            reload()
        except _ServedOn:
            pass
        finally:
            _unchanged = False
            _reloads += 1
            _say_reloaded(_reloads)

    server.spawn_worker = spawn_worker
    server.manage_workers = manage_workers
    server.reload = reload_once


class _ServedOn(Exception):
    """Ends gunicorn's `reload()` of a HUP that forked no workers, before its wait for the old ones to exit."""


_reloads = 0
"""HUPs this master has ended (gunicorn's `reload()` returned: the new workers warm, the old ones gone)."""


def _say_reloaded(reloads: int) -> None:
    """One model of several: tell the host this pool's HUP has ended. The host reloads nginx only then, so
    nginx and the pool change together (an added API key is never let through by nginx to be refused by a
    pool's old worker)."""
    host, pool = host_dir(), os.environ.get(ENV_POOL, "")
    if host is not None and pool:
        try:
            write_pool_reloads(host, pool, reloads)
        except OSError as exc:  # the host waits for it at most its reload deadline, then goes on
            log.warning("reload: cannot tell the host this reload ended: %s", exc)


def _wait_until_warm(server: Any, workers: list[Any], limit: float) -> None:
    """Poll until each of `workers` is warm or gone (reaped), at most `limit` seconds."""
    t0 = time.monotonic()
    waited = False
    while True:
        pending = [w for w in workers if w.pid in server.WORKERS and not is_warm(w)]
        if not pending:
            if waited:
                log.info("reload: the new workers are warm after %.1f s; stopping the old ones", time.monotonic() - t0)
            return
        if time.monotonic() - t0 >= limit:
            log.warning(
                "reload: %d new worker(s) not warm after %g s (server.graceful_timeout): pid %s; "
                "stopping the old workers anyway",
                len(pending),
                limit,
                ",".join(str(w.pid) for w in pending),
            )
            return
        waited = True
        time.sleep(HANDOVER_POLL_SECONDS)
        server.reap_workers()


# This worker's memory for the gauge, read again after a request at most every few seconds.
_MEMORY = MemoryProbe(interval=5.0)


def _publish_memory(s: Serving, memory: ProcessMemory | None) -> None:
    if memory is not None and s.pool.run.metrics is not None:
        from onnxpool.server import metrics

        metrics.worker_memory(s.settings.model.name, memory.private, memory.pss)


def child_exit(server: Any, worker: Any) -> None:
    s = serving()
    s.pool.slots.release(worker.age)
    s.pool.seats.release(worker.age)
    _forget_worker(s, worker.pid)


def _forget_worker(s: Serving, pid: int) -> None:
    """Master: drop a dead worker's live gauges (in-flight, load times); count the restart."""
    if s.pool.run.metrics is not None:
        from onnxpool.server import metrics

        metrics.worker_exited(pid)


def worker_exit(server: Any, worker: Any) -> None:
    # Runs in the worker (its last call: a graceful exit, a HUP's replacement) and
    # in the master when gunicorn finds a worker already gone (ESRCH), where
    # child_exit is skipped, so the slot must be freed here too. In the worker the
    # task releases what start_in_worker made (a worker killed by a signal it
    # cannot catch never gets here). (Workers exit normally: the master never
    # imports onnxruntime, so no thread of it was half-copied into them by fork;
    # see workers/session.py.)
    s = _serving
    if s is not None and os.getpid() == s.pool.master_pid:
        s.pool.slots.release(worker.age)
        s.pool.seats.release(worker.age)
        _forget_worker(s, worker.pid)
    elif _opened is not None:
        from onnxpool.server.app import close_in_worker  # loaded with the app already

        if _grpc is not None:  # gthread: the calls in flight finish, within graceful_timeout
            _grpc.stop().wait(s.settings.server.graceful_timeout if s is not None else 0)
        close_in_worker(_opened)


def nworkers_changed(server: Any, new_value: int, old_value: int | None) -> None:
    # TTIN/TTOU or gunicornc can change the count at runtime: slots already wrap
    # around the shares; say so loudly if that now oversubscribes the cores.
    if old_value is not None:
        log.info("worker count changed: %s -> %s", old_value, new_value)
        _warn_if_oversubscribed(serving().layout, new_value)
    if _serving is not None:
        _publish_build_info(_serving, new_value)


def on_exit(server: Any) -> None:
    # Master, last thing before it exits: remove this run's folder.
    if _serving is not None:
        _serving.pool.run.remove()


QUEUED_ATTRIBUTE = "onnxpool_queued"
"""Set on a request that found connections waiting in the worker's listen queues (pre_request)."""


def pre_request(worker: Any, req: Any) -> None:
    """Worker, a request's headers parsed: this worker is working until post_request (workers/wide.py).

    One `select` with no wait on the worker's listeners (a few microseconds) says whether other
    connections are waiting: under load a request then runs narrow even in the moment the other
    workers are between two requests and look idle on the board.
    """
    if not RUNTIME.runs_wide:
        return  # no wide runs in this pool: nothing to mark
    queued = _connections_waiting(worker)
    setattr(req, QUEUED_ATTRIBUTE, queued)
    RUNTIME.request_began(queued)


def _connections_waiting(worker: Any) -> bool:
    listeners = list(getattr(worker, "sockets", ()) or ())
    if not listeners:
        return False
    try:
        ready, _, _ = select.select(listeners, [], [], 0)
    except (OSError, ValueError):  # a listener closed meanwhile (a reload)
        return False
    return bool(ready)


def post_request(req: Any, resp: Any) -> None:
    """Worker, after each reply: let gunicorn close a finished connection without waiting for the client.

    gunicorn (27) closes every connection with `util.close_graceful`: shut the write side,
    then read until the client closes its side too (up to 2 s), so that request bytes still
    unread cannot make the kernel answer them with a reset that truncates the reply. The
    sync worker closes after every reply, so each request also waits for the client's FIN:
    two more context switches and a worker that cannot accept meanwhile. When the request
    was read to its end (a Content-Length body, or none) nothing is left to protect, so the
    read side is shut here: close_graceful's read then returns at once (it still drains
    whatever the client had already sent). Replies before the body was read (413, 401)
    keep the full wait. It matters most where requests are cheap: with half the /predict
    requests answered by the response cache, ~3 % more throughput (docs/BENCHMARKS.md).
    """
    # pre_request's mark ends before the reply leaves (uncork): a lone client's next request, sent as
    # soon as it has this reply, must find this worker idle, or it would not run wide.
    RUNTIME.request_ended(getattr(req, QUEUED_ATTRIBUTE, False))
    if resp is not None:
        wire.uncork(resp.sock)  # the whole reply is written: send it (see GenerationApp)
    if _settle_log is not None:
        _settle_log()  # the inference log's events, made only now that the reply has left
    RUNTIME.give_back()  # [model] memory_arena: a statm read, unless the worker grew past its headroom
    if _serving is not None:
        _publish_memory(_serving, _MEMORY.due())  # a clock read, unless the last reading is 5 s old
    if resp is None or not resp.headers_sent or not resp.should_close():
        return  # no reply written, or a keep-alive connection (gthread) that serves on
    reader = getattr(getattr(req, "body", None), "reader", None)
    if isinstance(reader, LengthReader) and reader.length == 0:
        with contextlib.suppress(OSError):  # the client may be gone already
            resp.sock.shutdown(socket.SHUT_RD)
