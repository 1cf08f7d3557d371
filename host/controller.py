"""`onnxpool serve` on a settings file with several models: plan, render, start supervisord, answer.

Who does what (docs/ARCHITECTURE.md, "Several models on one host"):
- This process (the host; systemd's main process, a pod's command) validates the file and
  every model's view of it, plans each model's budget and cgroup (host/budget.py,
  host/priority.py), writes supervisord's configuration (host/supervisor.py) and starts
  supervisord as its child. It starts nothing else itself and restarts nothing.
- supervisord runs the programs: the host's routes (host/routes.py), one gunicorn pool per model
  (the one-model server, told its model by $ONNXPOOL_POOL, on a socket in the run folder, its own
  run folder inside the host's) and nginx (host/front_door.py). A dead pool master, nginx or
  routes process is restarted alone, with back-off; the other models never notice. A pool
  supervisord gave up on is started again by this process, with a capped back-off
  (RETRY_SECONDS), and at once by a HUP.
- The janitor (host/program.py), a process of this one's beside supervisord, removes the run
  folder and the cgroups once supervisord has exited, however it ended: no reload can set it off.
- This process watches: every POLL_SECONDS one call to supervisord (each program's state) and,
  for a model that is not READY yet, one probe of its pool's /v2/health/ready; a signal wakes it
  at once (its wake-up fd). It writes each
  model's state (READY, LOADING, UNAVAILABLE with its pool's last error line) to host.json, which
  the host's routes read; it starts nginx once the models have started, re-renders it when the
  routable models change, and tells systemd READY=1 (`Type=notify`).
- SIGHUP: the file is read again and validated as a whole; a model added gets a program (routed
  once it is ready; a failure is its own: UNAVAILABLE, the others serve), a removed one leaves
  nginx first (its old workers gone) and then its pool is stopped, and every other pool gets its
  HUP: it re-reads its view of the file, its task's files and code and its model file exactly as
  a one-model server does (gunicorn replaces its workers, the old ones serving until the new ones
  are warm). A file that cannot be applied whole (a mistake, or a change only a restart can make:
  host/reading.py) changes nothing; the refusal is logged and shown (host.json's reading:
  /v2/models, /metrics). nginx, the routes and the pools read the keys file at the same HUP,
  never between.
- SIGTERM / SIGINT: this process stops nginx first (it finishes what it holds), then every pool at
  once, then the routes, all within graceful_timeout + 5 s, then supervisord; the janitor removes
  the cgroups and the run folder. If supervisord dies, its programs stop by their parent-death
  signal and this process exits 1 after cleaning up; if this process is killed, supervisord stops
  by the same signal.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import http.client
import importlib.util
import logging
import logging.config
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from onnxpool import logs, probe
from onnxpool.config.callers import CallerBook
from onnxpool.config.loader import (
    ENV_CONFIG_FILE,
    ENV_HOST_DIR,
    ENV_POOL,
    ConfigError,
    LoadedSettings,
    load_settings,
)
from onnxpool.config.settings import ModelEntry, Settings
from onnxpool.host import supervisor
from onnxpool.host.budget import ModelPlan, oversubscribed_budgets, plan_models
from onnxpool.host.front_door import FrontDoorError, PoolRoute, front_door_callers, write_checked_front_door
from onnxpool.host.nginx_workers import await_new_workers, nginx_workers
from onnxpool.host.priority import Priority, choose
from onnxpool.host.program import (
    PR_SET_PDEATHSIG,
    clean_up,
    group_members,
    leftover_file,
    read_group,
    share_output,
    signal_group,
)
from onnxpool.host.reading import restart_only_changes
from onnxpool.host.state import (
    METRICS_DIR,
    NGINX_DIR,
    POOLS_DIR,
    HostModel,
    Reading,
    pool_error_file,
    pool_socket,
    read_pool_error,
    read_pool_reloads,
    write_host,
)
from onnxpool.host.supervisor import (
    GRPC,
    NGINX,
    ROUTES,
    Program,
    Supervisor,
    group_file,
    pool_program,
    wrapped,
)
from onnxpool.host.view import GRPC_ROUTER
from onnxpool.host.watcher import WatchedPool, answers_ready, follow_routes, set_state
from onnxpool.proxy import nginx_binary
from onnxpool.server.model_states import LOADING, READY, UNAVAILABLE
from onnxpool.workers.cores import cpu_allowance
from onnxpool.workers.run_folder import RunFolder, remove_stale

log = logging.getLogger("onnxpool.host")

POOL_APP = "onnxpool.gunicorn_conf"
"""The one-model server's gunicorn configuration: each pool runs it (found, not imported: importing it
would configure a server)."""
READY_TIMEOUT_SECONDS = 600.0
"""A pool's first start: the preflight and every worker's warm-up (MiniLM INT8's first build is slow)."""
POLL_SECONDS = 0.5
START_POLL_SECONDS = 0.05
"""While models start or a reload waits for them: a READY seen sooner is a host ready sooner."""
PROBE_SECONDS = 1.0
POOL_START_SECONDS = 30
"""supervisord's startsecs for a pool: a pool that exits sooner failed to start (back-off, retries)."""
RETRY_SECONDS = (5.0, 10.0, 20.0, 40.0, 60.0)
"""A pool supervisord gave up on (FATAL) is started again after these, the last one repeating: a pool
that broke on something outside it (a full disk, a model file being copied) comes back by itself."""
HAND_OVER_SECONDS = 2.0
"""At a stop, how long nginx alone stops before the pools are told to (it passes on what it has read)."""
RUNS_DIR = "runs"
"""Each pool's own run folder goes inside the host's (`runs/<name>/`): whatever stops the host, a pool
killed in its start included, the janitor's clean-up takes it too."""
ROUTES_CONF = "onnxpool.host.routes_conf"


class HostError(Exception):
    """The host cannot serve: one line for the operator, exit 1."""


@dataclass
class Model(WatchedPool):
    """One model of the host as this process tracks it (its pool: host/watcher.py)."""

    plan: ModelPlan | None = None
    required: bool = True
    error: str = ""
    """Its pool's last error line (the reason without what the host does about it)."""
    pid: int = 0
    """The pool master's pid supervisord reports (0: none yet)."""
    ready_pid: int = 0
    """The pid that answered ready: a new pid (a restart) is LOADING until it answers."""
    has_program: bool = True
    reload_pending: bool = False
    """A HUP came while its pool was starting (a gunicorn master that is still loading dies of a HUP):
    it gets its HUP once it answers ready."""
    hup_from: int | None = None
    """How many HUPs its pool master had ended when the host sent it one (None: no HUP of the host's in
    flight). nginx is reloaded once the count passed it: the pool's new workers answer by then."""
    gave_up: int = 0
    """How many times in a row supervisord gave up on its pool (the host's back-off, RETRY_SECONDS)."""
    retry_at: float = 0.0
    """When the host starts it again (monotonic; 0: not scheduled)."""
    grpc_address: str = ""
    """Where its pool serves gRPC for the host's router: a loopback port given when the model is first
    planned and kept for its program's life (its restarts and every HUP); "" without [server] grpc_bind."""


@dataclass
class Host:
    config_file: Path
    loaded: LoadedSettings
    binary: str
    priority: Priority = field(init=False)
    run: RunFolder = field(init=False)
    models: dict[str, Model] = field(default_factory=dict)
    signals: list[int] = field(default_factory=list)
    supervisord: subprocess.Popen[bytes] | None = None
    control: Supervisor | None = None
    routed: tuple[PoolRoute, ...] | None = None
    """What nginx routes now (None: nginx not started)."""
    routed_callers: CallerBook | None = None
    """The callers nginx keeps apart now (a HUP that changes them or their quotas re-renders it)."""
    routed_settings: Settings | None = None
    """The settings nginx's files were rendered from (a HUP that changes any re-renders them)."""
    password: str = field(init=False)
    """supervisord's control socket's, made for this run (in its owner-only configuration file)."""
    notify_socket: str = field(init=False)
    leftover_deadline: float | None = None
    """When the workers of a killed nginx master were told to stop (`_retire_leftovers`)."""
    callers: CallerBook | None = None
    """The callers and quotas of the file as last applied (read at start and at each HUP, never between)."""
    reading: Reading = field(default_factory=lambda: Reading(True, time.time()))
    janitor: subprocess.Popen[bytes] | None = None
    wakeup: socket.socket | None = None
    """The read end of the signal wake-up fd: a signal ends the wait between two looks at once."""

    def __post_init__(self) -> None:
        self.priority = _priority(self.loaded.settings.server.budgets)
        self.run = RunFolder.create(self.loaded.settings.server.run_dir)
        # nginx started as root runs its workers as `nobody`: they must reach the pools' sockets and
        # nginx's temp folders through this folder (traverse only; nothing here can be listed).
        for folder in (self.run.path, self.run.path / POOLS_DIR, self.run.path / NGINX_DIR):
            folder.mkdir(exist_ok=True)
            folder.chmod(0o711)
        self.password = secrets.token_urlsafe(24)
        # Only this process talks to systemd: supervisord and the pools must not see the socket.
        self.notify_socket = os.environ.pop("NOTIFY_SOCKET", "")

    @property
    def settings(self) -> Settings:
        return self.loaded.settings

    @property
    def routes_address(self) -> str:
        return f"unix:{self.run.path / 'routes.sock'}"  # as host/routes_conf.py binds

    # -- planning -------------------------------------------------------------------------

    def _entries(self, loaded: LoadedSettings) -> tuple[dict[str, ModelEntry], dict[str, str]]:
        """The models to serve, and those left out (an optional model whose file is missing: one line)."""
        entries: dict[str, ModelEntry] = {}
        left_out: dict[str, str] = {}
        for name, entry in loaded.settings.models.items():
            if not entry.path.is_file():
                problem = f"model {name}: {entry.path} does not exist"
                if not entry.optional:
                    raise HostError(f"{problem} ([models.{name}] optional = true serves the others without it)")
                log.warning("%s; the other models serve without it (optional = true)", problem)
                left_out[name] = f"{entry.path} does not exist"
                continue
            # Each pool's own view of the file, validated now: a mistake stops the host before it starts
            # anything (or, on a reload, changes nothing), in one line.
            load_settings(self.config_file, pool=name)
            entries[name] = entry
        if not entries:
            raise HostError("no model to serve")
        return entries, left_out

    def _plan(self, loaded: LoadedSettings) -> tuple[dict[str, ModelPlan], dict[str, str]]:
        entries, left_out = self._entries(loaded)
        allowance = cpu_allowance()
        plans = plan_models(entries, allowance)
        for plan in plans.values():
            layout = plan.layout
            shares = (
                " ".join(f"w{slot}:{_cores(layout.core_share_for(slot))}" for slot in range(layout.workers))
                if layout.pinned
                else f"unpinned within {_cores(layout.cores)}"
            )
            log.info(
                "model %s: budget %.2g cpu; %d workers x %d threads; cores %s; priority %s",
                plan.name,
                plan.budget,
                layout.workers,
                layout.threads,
                shares,
                self.priority.describe(plan),
            )
        total = oversubscribed_budgets(plans, allowance.cpus)
        if total is not None:
            log.warning(
                "budgets sum to %.3g cpus on %d usable: they hold as proportions of the host", total, allowance.cpus
            )
        return plans, left_out

    # -- supervisord ----------------------------------------------------------------------

    def _programs(self) -> list[Program]:
        """supervisord's programs: each section holds only what is fixed for the host's life (a changed
        section is a restarted program; what a reload changes reaches a program by its HUP)."""
        run = self.run.path
        env = {ENV_CONFIG_FILE: str(self.config_file), ENV_HOST_DIR: str(run)}
        programs = [
            Program(
                ROUTES,
                wrapped(run, ROUTES, [sys.executable, "-m", "gunicorn", "-c", f"python:{ROUTES_CONF}"]),
                supervisor.PRIORITY[ROUTES],
                environment=env,
            ),
        ]
        grpc_bind = self.settings.server.grpc_bind
        if grpc_bind:
            router = [sys.executable, "-m", GRPC_ROUTER, "--bind", grpc_bind]
            programs.append(Program(GRPC, wrapped(run, GRPC, router), supervisor.PRIORITY[GRPC], environment=env))
        for name, model in self.models.items():
            if not model.has_program:
                continue
            programs.append(
                Program(
                    pool_program(name),
                    wrapped(
                        run,
                        pool_program(name),
                        [sys.executable, "-m", "gunicorn", "-c", _pool_conf()],
                        cgroup=self.priority.group(name),
                    ),
                    supervisor.POOL_PRIORITY,
                    environment={
                        **env,
                        ENV_POOL: name,
                        "ONNXPOOL_SERVER__BIND": model.address,
                        # Its gRPC port for the host's router ("" = none: never the host's own grpc_bind).
                        "ONNXPOOL_SERVER__GRPC_BIND": model.grpc_address,
                        "ONNXPOOL_SERVER__RUN_DIR": str(self._pool_runs(name)),
                        # No pid file of its own (the host's), no control socket, no nginx of its own to wait for.
                        "ONNXPOOL_SERVER__PIDFILE": "",
                        "ONNXPOOL_SERVER__CONTROL_SOCKET": "",
                        "ONNXPOOL_NGINX__PIDFILE": "",
                        "ONNXPOOL_METRICS__DIR": str(run / METRICS_DIR / name),
                    },
                    startsecs=POOL_START_SECONDS,
                )
            )
        nginx_conf = run / NGINX_DIR / "nginx.conf"
        programs.append(
            Program(
                NGINX,
                wrapped(
                    run,
                    NGINX,
                    [self.binary, "-p", str(nginx_conf.parent), "-c", str(nginx_conf), "-e", "stderr"],
                    hand_over=True,
                ),
                supervisor.PRIORITY[NGINX],
                autostart=False,
                stopsignal="QUIT",  # graceful: it finishes what it holds (worker_shutdown_timeout)
            )
        )
        return programs

    def _pool_runs(self, name: str) -> Path:
        """Where a model's pool makes its run folder (RUNS_DIR)."""
        return self.run.path / RUNS_DIR / name

    def _write_supervisor_conf(self) -> Path:
        path = self.run.path / "supervisor" / "supervisord.conf"
        path.parent.mkdir(mode=0o700, exist_ok=True)
        path.write_text(supervisor.render(self.run.path, self._programs(), self.password), encoding="utf-8")
        path.chmod(0o600)
        return path

    def _start_supervisord(self) -> None:
        share_output(supervisor.output_socket(self.run.path))  # each program writes its log lines itself
        conf = self._write_supervisor_conf()
        env = dict(os.environ)
        env.setdefault("ORT_DISABLE_TELEMETRY", "1")
        self.supervisord = subprocess.Popen(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(conf)],
            env=env,
            preexec_fn=_die_with_parent,  # this process killed: supervisord stops every program, in order
        )
        # The janitor: in the host's session, as the programs whose groups it waits for (group_members looks in
        # its own session); it ignores the stop signals (host/program.py), woken by supervisord's exit alone.
        self.janitor = subprocess.Popen(
            [
                *(sys.executable, "-m", "onnxpool.host.program", "janitor", "--run-dir", str(self.run.path)),
                *("--cgroup", str(self.priority.folder or ""), "--supervisord", str(self.supervisord.pid)),
                *("--wait", str(self.settings.server.graceful_timeout + 10)),
            ],
        )
        self.control = Supervisor(self.run.path, self.password)
        self.control.wait_running(lambda: self.supervisord is not None and self.supervisord.poll() is None)

    # -- watching -------------------------------------------------------------------------

    def _poll(self) -> bool:
        """One look at every program: update each model's state; True when a state changed."""
        assert self.control is not None
        try:
            states = self.control.states()
        except supervisor.CALL_ERRORS:
            self.control.reconnect()
            return False  # supervisord is stopping or gone: `serve` sees its exit
        changed = False
        for name, model in self.models.items():
            info = states.get(pool_program(name)) if model.has_program else None
            if info is None:
                continue
            statename, pid = info["statename"], int(info["pid"] or 0)
            if pid and pid != model.pid:
                model.pid = pid
                model.starts += 1
                if model.starts > 1:
                    log.warning("model %s: its pool was restarted (pid %d)", name, pid)
            if statename in supervisor.RUNNING_STATES and pid:
                if model.ready_pid != pid:
                    if answers_ready(self.run.path, model):
                        model.ready_pid, model.gave_up = pid, 0
                        changed |= set_state(model, READY, "")
                        if model.reload_pending:  # its master read the file before the HUP: again now
                            self._reload_pool(model, info)
                    else:
                        changed |= set_state(model, LOADING, "")
                else:
                    follow_routes(self.run.path, model)  # a HUP replaced its task: nginx follows its routes
            elif statename in supervisor.FAILED_STATES or statename in ("STOPPED", "STOPPING"):
                changed |= self._failed(model, statename)
            if model.hup_from is not None and (
                model.ready_pid != pid or read_pool_reloads(self.run.path, name) > model.hup_from
            ):
                model.hup_from = None  # its HUP ended; or it is not the master that got it (LOADING covers that)
        return changed

    def _failed(self, model: Model, statename: str) -> bool:
        """A pool that is not running: UNAVAILABLE with its own last error line; one supervisord gave up on
        is started again after the host's back-off, and its stale run folder goes now."""
        model.ready_pid = 0
        # Its own last error line; else what is known (supervisord keeps no status of a start that ended).
        model.error = why = read_pool_error(self.run.path, model.name) or (
            "its pool's master exited without an error line (killed, or out of memory: the host's log has "
            "supervisord's line on how it ended)"
        )
        if statename == "BACKOFF":
            why += " (restarting)"
        elif statename == "FATAL":
            if not model.retry_at:
                wait = RETRY_SECONDS[min(model.gave_up, len(RETRY_SECONDS) - 1)]
                model.gave_up += 1
                model.retry_at = time.monotonic() + wait
                with contextlib.suppress(OSError):
                    remove_stale(self._pool_runs(model.name))
                log.error("model %s: its pool keeps failing: started again in %g s (a HUP: at once)", model.name, wait)
            if time.monotonic() >= model.retry_at:
                self._start_pool(model)
            why += " (started again with back-off; a HUP retries it at once)"
        return set_state(model, UNAVAILABLE, why)

    def _start_pool(self, model: Model) -> None:
        """Start a pool that is not running (supervisord gave up on it, or it stopped)."""
        assert self.control is not None
        model.retry_at = 0.0
        pool_error_file(self.run.path, model.name).unlink(missing_ok=True)
        log.info("model %s: its pool starts again", model.name)
        with contextlib.suppress(xmlrpc.client.Fault):
            self.control.start(pool_program(model.name))

    def _publish(self) -> None:
        models = []
        for name, model in self.models.items():
            plan = model.plan
            models.append(
                HostModel(
                    name=name,
                    version=model.entry.version,
                    aliases=model.entry.aliases,
                    address=model.address if model.has_program else "",
                    grpc_address=model.grpc_address if model.has_program else "",
                    state=model.state,
                    reason=model.reason,
                    budget=plan.budget if plan else 0.0,
                    workers=plan.layout.workers if plan else 0,
                    threads=plan.layout.threads if plan else 0,
                    priority=self.priority.describe(plan) if plan else "",
                    nice=plan.nice if plan and self.priority.kind == "nice" else 0,
                    required=model.required,
                    starts=model.starts,
                )
            )
        write_host(self.run.path, models, self.reading, self.settings.server.graceful_timeout)

    # -- the front door -------------------------------------------------------------------

    def _routable(self) -> tuple[PoolRoute, ...]:
        """The pools nginx routes to: every model with a program whose pool has loaded once, in the
        file's order (a route several models' tasks have, /predict, is the first one's)."""
        return tuple(model.route() for model in self.models.values() if model.has_program and model.routed)

    def _front_door_files(self, pools: tuple[PoolRoute, ...]) -> Path:
        return write_checked_front_door(self.run.path / NGINX_DIR, self.loaded, pools, self.routes_address, self.binary)

    def _route(self) -> None:
        """Start nginx, or re-render it when the routable pools or the callers changed (a HUP: its old workers
        finish what they hold, and this returns once they are gone). A model that cannot be routed (nginx's
        js module missing) is UNAVAILABLE."""
        assert self.control is not None
        pools = self._routable()
        callers = self.callers
        if pools == self.routed and callers == self.routed_callers and self.settings == self.routed_settings:
            return
        try:
            self._front_door_files(pools)
        except FrontDoorError as exc:
            if self.routed is None:
                raise HostError(str(exc)) from None
            added = [pool.name for pool in pools if pool.name not in {known.name for known in self.routed}]
            if not added:
                log.error("reload: the front door keeps its files: %s", exc)
            for name in added:
                set_state(self.models[name], UNAVAILABLE, str(exc))
                self._drop_program(name)
            self._publish()
            return
        if self.routed is None:
            self.control.start(NGINX)
            self._wait_front_door()
        else:
            master = self._nginx_master()
            before = nginx_workers(master)
            self.control.signal(NGINX, "HUP")
            await_new_workers(master, before, self.settings.server.graceful_timeout + 5)
        self.routed, self.routed_callers, self.routed_settings = pools, callers, self.settings
        for pool in pools:  # served through the front door: from now on the host is ready only with it
            model = self.models[pool.name]
            model.required = model.required or not model.entry.optional

    def _nginx_master(self) -> int:
        assert self.control is not None
        return int(self.control.states().get(NGINX, {}).get("pid") or 0)

    def _retire_leftovers(self) -> None:
        """The workers of a killed nginx master serve until the new nginx answers; then they are told to
        stop gracefully (QUIT: they finish what they hold), and killed if still there after the grace."""
        record = leftover_file(group_file(self.run.path, NGINX))
        pgid = read_group(record)
        if pgid is None:
            return
        if self.leftover_deadline is None:
            if not self._front_door_answers():
                return
            log.info("front door: nginx restarted; the workers of its killed master stop gracefully")
            signal_group(pgid, signal.SIGQUIT)
            self.leftover_deadline = time.monotonic() + self.settings.server.graceful_timeout + 5
        elif time.monotonic() > self.leftover_deadline:
            signal_group(pgid, signal.SIGKILL)
        if not group_members(pgid):
            record.unlink(missing_ok=True)
            self.leftover_deadline = None

    def _front_door_answers(self) -> bool:
        connection = probe.connection(self.settings.server.bind, PROBE_SECONDS)
        try:
            connection.request("GET", "/nginx/live")
            return connection.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            connection.close()

    def _wait_front_door(self) -> None:
        """Until nginx answers on [server] bind (any HTTP reply)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._front_door_answers():
                return
            if self._supervisor_died():
                raise HostError(self._supervisor_death())
            time.sleep(0.05)
        raise HostError(f"nginx does not answer on {self.settings.server.bind} (its error is above)")

    # -- life cycle -----------------------------------------------------------------------

    def notify(self, state: str) -> None:
        """systemd's readiness protocol (`Type=notify`, NotifyAccess=main): this process is the unit's."""
        address = self.notify_socket
        if not address:
            return
        if address.startswith("@"):
            address = "\0" + address[1:]  # an abstract socket
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(state.encode(), address)

    def _track(self, plans: dict[str, ModelPlan], left_out: dict[str, str], required: bool) -> None:
        """Records for the file's models, in its order (`required`: the models of the start)."""
        models: dict[str, Model] = {}
        ports = _GrpcPorts(self.settings.server.grpc_bind, self.models.values(), self.settings.models.values())
        for name, entry in self.settings.models.items():
            known = self.models.get(name)
            plan = plans.get(name)
            if known is not None and known.has_program and plan is not None:
                models[name] = dataclasses.replace(known, entry=entry, plan=plan)  # `known` stays as it was
                continue
            model = Model(
                name=name,
                entry=entry,
                plan=plan,
                address=entry.bind or pool_socket(self.run.path, name),
                required=required and not entry.optional,
                has_program=plan is not None,
                grpc_address=(entry.grpc_bind or ports.next()) if plan is not None and ports.on else "",
            )
            if plan is None:
                model.state, model.reason = UNAVAILABLE, left_out.get(name, "not planned")
            models[name] = model
        ports.close()
        self.models = models

    def start(self) -> int | None:
        """Until every model started (or failed) and nginx is up; an exit status if the host must stop."""
        if self.priority.kind == "nice":
            log.info("budgets are held by nice values per worker (%s)", self.priority.why)
        try:
            plans, left_out = self._plan(self.loaded)
            self.callers = front_door_callers(self.settings)
        except (ConfigError, FrontDoorError) as exc:
            raise HostError(str(exc)) from None
        self._track(plans, left_out, required=True)
        for name in plans:
            (self.run.path / METRICS_DIR / name).mkdir(parents=True, exist_ok=True)
        self.priority.apply(plans.values())
        self._publish()  # the pools' workers read their nice value from it
        self._start_supervisord()
        if not self._settle(starting=True):
            return 0
        self._route()
        self._publish()
        self.notify("READY=1")
        log.info(
            "front door: nginx on %s routes %d models: %s",
            self.settings.server.bind,
            len(self.routed or ()),
            ", ".join(f"{pool.name} -> {pool.address}" for pool in self.routed or ()),
        )
        if self.settings.server.grpc_bind:
            log.info(
                "gRPC: the router on %s routes by model name: %s",
                self.settings.server.grpc_bind,
                ", ".join(f"{m.name} -> {m.grpc_address}" for m in self.models.values() if m.grpc_address),
            )
        return None

    def _settle(self, starting: bool) -> bool:
        """Watch until no model with a program is LOADING (each READY or UNAVAILABLE) or in a HUP of the
        host's (`hup_from`); False when a stop was asked meanwhile. `starting`: a required model that fails
        stops the host (HostError)."""
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while True:
            if self._stop_requested():
                return False
            if self._supervisor_died():
                raise HostError(self._supervisor_death())
            if self._poll():
                self._publish()
            if starting:
                for model in self.models.values():
                    if model.state == UNAVAILABLE and model.required and model.has_program:
                        raise HostError(f"model {model.name}: {model.error or model.reason}")
            waiting = [
                m.name for m in self.models.values() if m.has_program and (m.state == LOADING or m.hup_from is not None)
            ]
            if not waiting:
                return True
            if time.monotonic() > deadline:
                message = f"models {', '.join(waiting)}: not ready after {READY_TIMEOUT_SECONDS:.0f} s"
                if starting:
                    raise HostError(message)
                log.error("reload: %s", message)
                return True
            time.sleep(START_POLL_SECONDS)

    def _stop_requested(self) -> bool:
        return any(signum != signal.SIGHUP for signum in self.signals)

    def _supervisor_died(self) -> bool:
        return self.supervisord is None or self.supervisord.poll() is not None

    def _supervisor_death(self) -> str:
        status = self.supervisord.returncode if self.supervisord is not None else None
        return f"supervisord exited (status {status}): its programs stop with it; the host exits 1"

    def reload(self) -> None:
        """HUP: apply the re-read settings file whole (models added and removed, every other pool's own
        reload), or nothing of it (the refusal shown in host.json's reading)."""
        assert self.control is not None
        try:
            loaded = load_settings(self.config_file, pool="")
            if not loaded.settings.models:
                raise ConfigError("the file no longer names several models ([models.<name>])")
            restart_only_changes(self.loaded.settings, loaded.settings)
            plans, left_out = self._plan(loaded)
            callers = front_door_callers(loaded.settings)
        except (ConfigError, HostError, FrontDoorError, OSError) as exc:
            self.reading = Reading(False, time.time(), str(exc))
            log.error("reload: refused, nothing changed (the running models keep their settings): %s", exc)
            self._publish()
            return
        self.loaded, self.callers, self.reading = loaded, callers, Reading(True, time.time())
        old = self.models
        # A removed model leaves the host's lists and readiness now; its pool runs until nginx let go of it.
        removed = [name for name, model in old.items() if model.has_program and name not in plans]
        self.priority.apply(plans.values())
        self._track(plans, left_out, required=False)
        for name in plans:
            (self.run.path / METRICS_DIR / name).mkdir(parents=True, exist_ok=True)
        self._publish()  # the pools' new workers read their nice value from it
        self._add_programs()
        states = self.control.states()
        for name, model in self.models.items():
            if model.has_program and name in old and old[name].has_program:
                self._reload_pool(model, states.get(pool_program(name), {}))
        self.control.signal(ROUTES, "HUP")  # keys, docs and metrics settings
        # One nginx reload per HUP, once the added models are ready (or failed) and the kept pools' HUPs ended
        # (their new workers answer): it routes to the added models and no longer to the removed ones, whose
        # pools then finish what nginx already sent them and stop; and nginx's callers and quotas change with
        # the pools' keys, not before them.
        self._settle(starting=False)
        self._route()
        for name in removed:
            log.info("reload: model %s removed: its pool stops after its in-flight requests", name)
            self._drop_program(name)
        self._publish()
        log.info("reload: applied (%d models)", sum(model.has_program for model in self.models.values()))

    def _reload_pool(self, model: Model, info: dict[str, object]) -> None:
        """A kept model's pool re-reads the file (its HUP), as a one-model server does; one that is not
        running is started at once (the operator's fix is in); one still starting gets its HUP when ready."""
        statename, pid = info.get("statename"), int(str(info.get("pid") or 0))
        model.reload_pending = False
        if statename in supervisor.RUNNING_STATES and pid and model.ready_pid == pid:
            log.info("reload: model %s: its pool re-reads the file (HUP)", model.name)
            pool_error_file(self.run.path, model.name).unlink(missing_ok=True)
            assert self.control is not None
            model.hup_from = read_pool_reloads(self.run.path, model.name)  # read before the HUP it counts
            self.control.signal(pool_program(model.name), "HUP")
        elif statename in supervisor.RUNNING_STATES:
            model.reload_pending = True
        else:
            model.gave_up = 0
            self._start_pool(model)

    def _add_programs(self) -> None:
        """supervisord reads its configuration anew; programs added are started (supervisorctl update).
        Sections hold nothing a reload may change (`_programs`), so none is restarted."""
        assert self.control is not None
        self._write_supervisor_conf()
        added, _changed, _removed = self.control.update()
        for program in added:
            name = program.removeprefix(supervisor.POOL_PREFIX)
            if name in self.models:
                log.info("reload: model %s added: its pool starts", name)
                pool_error_file(self.run.path, name).unlink(missing_ok=True)
            self.control.add(program)

    def _drop_program(self, name: str) -> None:
        """Stop and forget a model's program; its metrics, files, run folder and cgroup go with it."""
        assert self.control is not None
        model = self.models.get(name)
        if model is not None:
            model.has_program = False
        self._write_supervisor_conf()
        with contextlib.suppress(xmlrpc.client.Fault):
            self.control.remove(pool_program(name))
        shutil.rmtree(self.run.path / METRICS_DIR / name, ignore_errors=True)
        shutil.rmtree(self._pool_runs(name), ignore_errors=True)
        for suffix in (".json", ".error", ".reloads"):
            (self.run.path / POOLS_DIR / f"{name}{suffix}").unlink(missing_ok=True)
        self.priority.remove(name)

    def serve(self) -> int:
        """Until a signal stops the host (0), or supervisord dies (1: systemd or the kubelet restarts it)."""
        while True:
            while self.signals:
                signum = self.signals.pop(0)
                if signum == signal.SIGHUP:
                    log.info("reload: re-reading %s", self.config_file)
                    self.notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
                    try:
                        self.reload()
                    except (*supervisor.CALL_ERRORS, HostError) as exc:
                        log.error("reload: not finished: %s", exc)
                    self.notify("READY=1")
                else:
                    log.info("stopping (%s): nginx first, then the pools", signal.Signals(signum).name)
                    self.notify("STOPPING=1")
                    return self.stop()
            if self._supervisor_died():
                log.error("%s", self._supervisor_death())
                self.clean_up()
                return 1
            changed = self._poll()
            self._retire_leftovers()
            try:
                self._route()
            except HostError as exc:
                log.error("front door: %s", exc)
            if changed:
                self._publish()
            self._sleep(POLL_SECONDS)

    def _sleep(self, seconds: float) -> None:
        """Until the next look, or a signal (its wake-up fd): a HUP or TERM is handled at once."""
        if self.wakeup is None:
            time.sleep(seconds)
            return
        readable, _, _ = select.select([self.wakeup], [], [], seconds)
        if readable:
            with contextlib.suppress(OSError):
                self.wakeup.recv(64)

    def stop(self) -> int:
        """nginx first (it finishes what it holds), then every pool at once, then the routes, within
        graceful_timeout + 5 s; then supervisord; then nothing of the host is left."""
        if self.supervisord is not None and self.supervisord.poll() is None:
            with contextlib.suppress(*supervisor.CALL_ERRORS):
                self._stop_programs()
            self.supervisord.send_signal(signal.SIGTERM)
            try:
                self.supervisord.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.supervisord.kill()
                self.supervisord.wait()
        self.clean_up()
        return 0

    def _stop_programs(self) -> None:
        """nginx first, then every pool and the routes at once (`Supervisor.stop_in_waves`); what is left at
        graceful_timeout + 5 s is killed."""
        assert self.control is not None
        pools = [pool_program(name) for name, model in self.models.items() if model.has_program]
        grace = self.settings.server.graceful_timeout + 5
        doors = [NGINX, GRPC] if self.settings.server.grpc_bind else [NGINX]
        for program in self.control.stop_in_waves(doors, [*pools, ROUTES], HAND_OVER_SECONDS, grace):
            pgid = read_group(group_file(self.run.path, program))
            if pgid is not None and group_members(pgid):
                log.warning("stopping: %s outlived graceful_timeout + 5 s: killed", program)
                signal_group(pgid, signal.SIGKILL)

    def clean_up(self) -> None:
        clean_up(self.run.path, self.priority.folder, self.settings.server.graceful_timeout + 10)
        self.priority.remove()
        if self.janitor is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.janitor.wait(timeout=5)  # it found nothing left to do


def _append_output() -> None:
    """Write stdout and stderr at their end (O_APPEND). supervisord passes its programs' output on
    through /dev/stdout, opened anew in append mode; a log file this process writes at its own offset
    would overwrite what they appended. On a pipe or terminal (journald, kubectl logs) nothing changes."""
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)


class _GrpcPorts:
    """Loopback ports for the pools' gRPC (the router's only way in), none of them a port a kept model has.
    Each is free when chosen; its socket stays open until every port of the batch is chosen, so that two
    models never get the same one."""

    def __init__(self, grpc_bind: str, kept: Iterable[Model], entries: Iterable[ModelEntry]) -> None:
        self.on = bool(grpc_bind)
        self.taken = {model.grpc_address for model in kept if model.grpc_address}
        self.taken |= {entry.grpc_bind for entry in entries if entry.grpc_bind}
        self.held: list[socket.socket] = []

    def next(self) -> str:
        if not self.on:
            return ""
        while True:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            self.held.append(sock)
            address = f"127.0.0.1:{sock.getsockname()[1]}"
            if address not in self.taken:
                self.taken.add(address)
                return address

    def close(self) -> None:
        for sock in self.held:
            sock.close()


def _pool_conf() -> str:
    spec = importlib.util.find_spec(POOL_APP)
    if spec is None or spec.origin is None:
        raise HostError(f"{POOL_APP} is not installed with onnxpool: reinstall it")
    return spec.origin


PR_SET_CHILD_SUBREAPER = 36


def _die_with_parent() -> None:
    """In supervisord's process before exec: SIGTERM when the host dies (it then stops every program),
    and the subreaper of its programs' orphans (a killed pool master's workers): they stay in its tree
    instead of going to pid 1 (the host itself, in a container, which reaps no stranger), and
    supervisord, which reaps any child, collects them when they exit."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _priority(budgets: str) -> Priority:
    """`[server] budgets`: the mechanism that holds the budgets (host/priority.py)."""
    if budgets == "nice":
        return Priority("nice", why="[server] budgets = nice")
    chosen = choose(f"{os.getpid()}")
    if budgets == "cgroup" and chosen.kind == "nice":
        raise HostError(f"[server] budgets = cgroup, but no cgroup can be made here: {chosen.why}")
    return chosen


def _cores(cores: tuple[int, ...]) -> str:
    return ",".join(map(str, cores)) or "none"


def serve_models(config_file: Path) -> int:
    """`onnxpool serve` with several models: returns the exit status."""
    # The stop signals are taken first: one that comes while the host makes its run folder is handled once
    # it can be (the start stops, nothing is left), not by the default action that would leave the folder.
    signals: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(signum, lambda signum, _frame: signals.append(signum))
    wakeup, wake = socket.socketpair()
    for end in (wakeup, wake):
        end.setblocking(False)
    signal.set_wakeup_fd(wake.fileno(), warn_on_full_buffer=False)
    try:
        loaded = load_settings(config_file, pool="")
    except ConfigError as exc:
        print(f"onnxpool: error: {exc}", file=sys.stderr)
        return 1
    logging.config.dictConfig(logs.logconfig_dict(loaded.settings.logging))
    _append_output()
    binary = nginx_binary()
    if binary is None:
        print(
            "onnxpool: error: several models are served behind nginx (their one front door on [server] bind), "
            "and nginx is not installed (Debian: apt-get install nginx-light)",
            file=sys.stderr,
        )
        return 1
    try:
        host = Host(config_file, loaded, binary, signals=signals, wakeup=wakeup)
    except HostError as exc:
        print(f"onnxpool: error: {exc}", file=sys.stderr)
        return 1
    pidfile = Path(loaded.settings.server.pidfile) if loaded.settings.server.pidfile else None
    if pidfile is not None:
        pidfile.write_text(f"{os.getpid()}\n")
    try:
        try:
            status = host.start()
        except (HostError, ConfigError, OSError) as exc:
            print(f"onnxpool: error: {exc}", file=sys.stderr, flush=True)
            host.stop()
            return 1
        if status is not None:
            log.info("stopped while the models were starting")
            return host.stop()
        return host.serve()
    finally:
        if pidfile is not None:
            pidfile.unlink(missing_ok=True)
