"""`onnxpool serve` on a settings file with several models: one gunicorn pool per model, one nginx in front.

Process rules (docs/ARCHITECTURE.md, "Several models"):
- This process starts, for each `[models.<name>]`, one gunicorn master (the same
  `onnxpool serve` a single model runs, told by $ONNXPOOL_POOL which model is its own),
  bound to its own socket, and one nginx on `[server] bind` that routes each model's
  requests to its pool. gunicorn replaces a dead worker on its model's cores; this
  process replaces nothing: if a pool's master or nginx dies, it stops the rest and
  exits 1, and systemd (Restart=on-failure) or Kubernetes restarts the whole host.
- Each pool's master joins its model's cgroup between fork and exec, before gunicorn
  forks a worker, so every worker (and every replacement) carries the model's CPU
  weight (workers/priority.py); without a cgroup the workers set their nice value.
- SIGHUP re-reads the settings file: a model added gets a pool (nginx routes to it once
  it is ready), a removed one leaves nginx first and then stops gracefully, a changed one
  (its settings, its file, its budget) is HUPed (gunicorn replaces only its workers); the
  others are not touched. A bad file is logged and the running models stay.
- SIGTERM / SIGINT: nginx stops gracefully first (it finishes what it holds), then the
  pools (each finishes its in-flight requests). SIGQUIT is passed on the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import logging.config
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from onnxpool import logs, probe
from onnxpool.config.loader import (
    ENV_CONFIG_FILE,
    ENV_HOST_DIR,
    ENV_POOL,
    ConfigError,
    LoadedSettings,
    load_settings,
    pool_view,
)
from onnxpool.config.nginx import ROUTER_MODULE, PoolRoute, needs_router, render_main, render_site, router_script
from onnxpool.config.settings import ModelEntry, Settings
from onnxpool.proxy import TEMP_FOLDERS, nginx_binary
from onnxpool.workers.budget import ModelPlan, oversubscribed_budgets, plan_models
from onnxpool.workers.cores import cpu_allowance
from onnxpool.workers.host_state import (
    METRICS_DIR,
    NGINX_DIR,
    POOLS_DIR,
    HostModel,
    pool_socket,
    read_pool_routes,
    write_host,
)
from onnxpool.workers.priority import Priority, choose, renice_workers
from onnxpool.workers.run_folder import RunFolder

log = logging.getLogger("onnxpool.host")

GUNICORN_CONF = Path(__file__).resolve().with_name("gunicorn_conf.py")
READY_TIMEOUT_SECONDS = 600.0
"""A pool's first start: the preflight and every worker's warm-up (MiniLM INT8's first build is slow)."""
POLL_SECONDS = 0.2


class HostError(Exception):
    """The host cannot serve: one line for the operator, exit 1."""


@dataclass
class Pool:
    """One model's running gunicorn master."""

    name: str
    address: str
    process: subprocess.Popen[bytes]
    fingerprint: str
    routes: tuple[str, ...] = ()


def is_several_models(loaded: LoadedSettings) -> bool:
    return bool(loaded.settings.models)


class Host:
    """The host's state: its settings, plans, pools and nginx."""

    def __init__(self, config_file: Path, loaded: LoadedSettings, binary: str) -> None:
        self.config_file = config_file
        self.loaded = loaded
        self.binary = binary
        self.priority = _priority(loaded.settings.server.budgets)
        self.run = RunFolder.create(loaded.settings.server.run_dir)
        # nginx started as root runs its workers as `nobody`: they must reach the pools' sockets and
        # nginx's temp folders through this folder (traverse only; nothing here can be listed).
        for folder in (self.run.path, self.run.path / POOLS_DIR, self.run.path / NGINX_DIR):
            folder.mkdir(exist_ok=True)
            folder.chmod(0o711)
        self.pools: dict[str, Pool] = {}
        self.left_out: dict[str, str] = {}
        self.nginx: subprocess.Popen[bytes] | None = None
        self.plans: dict[str, ModelPlan] = {}
        self.starting: list[Pool] = []
        """Pools spawned and not ready yet (stopped with the host if it stops meanwhile)."""
        self.signals: list[int] = []
        # Only this process talks to systemd: the pools' masters must not see the socket.
        self.notify_socket = os.environ.pop("NOTIFY_SOCKET", "")

    @property
    def settings(self) -> Settings:
        return self.loaded.settings

    # -- planning -------------------------------------------------------------------------

    def _entries(self, loaded: LoadedSettings) -> dict[str, ModelEntry]:
        """The models to serve: a missing file of an optional model is left out (one line)."""
        entries: dict[str, ModelEntry] = {}
        for name, entry in loaded.settings.models.items():
            if not entry.path.is_file():
                problem = f"model {name}: {entry.path} does not exist"
                if not entry.optional:
                    raise HostError(f"{problem} ([models.{name}] optional = true serves the others without it)")
                log.warning("%s; the other models serve without it (optional = true)", problem)
                self.left_out[name] = f"{entry.path} does not exist"
                continue
            self.left_out.pop(name, None)
            entries[name] = entry
        if not entries:
            raise HostError("no model to serve")
        return entries

    def _plan(self, loaded: LoadedSettings) -> dict[str, ModelPlan]:
        entries = self._entries(loaded)
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
        return plans

    def _fingerprint(self, name: str, plan: ModelPlan) -> str:
        """What a pool serves: a change (settings, its model file, its plan) replaces its workers on HUP.

        Its nice value is not part of it: it follows the neighbours' budgets (the heaviest worker is at
        0), and a reload that changes only it renices the running workers (`reload`)."""
        raw = _read_raw(self.config_file)
        entry = self.settings.models[name]
        stat = entry.path.stat()
        document = {
            "view": pool_view(raw, name, self.config_file),
            "file": [stat.st_mtime_ns, stat.st_size],
            "plan": [plan.budget, plan.layout.workers, plan.layout.threads],
        }
        return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()

    # -- pools ----------------------------------------------------------------------------

    def _spawn(self, name: str) -> Pool:
        entry = self.settings.models[name]
        address = entry.bind or pool_socket(self.run.path, name)
        env = dict(os.environ)
        env.setdefault("ORT_DISABLE_TELEMETRY", "1")
        env.update(
            {
                ENV_CONFIG_FILE: str(self.config_file),
                ENV_POOL: name,
                ENV_HOST_DIR: str(self.run.path),
                "ONNXPOOL_SERVER__BIND": address,
                # One pid file (the host's), no control socket, no nginx of their own to wait for.
                "ONNXPOOL_SERVER__PIDFILE": "",
                "ONNXPOOL_SERVER__CONTROL_SOCKET": "",
                "ONNXPOOL_NGINX__PIDFILE": "",
                "ONNXPOOL_METRICS__DIR": str(self.run.path / METRICS_DIR / name),
            }
        )
        (self.run.path / METRICS_DIR / name).mkdir(parents=True, exist_ok=True)
        priority = self.priority

        def join_cgroup() -> None:  # in the child, before exec: gunicorn's workers inherit the cgroup
            priority.join(name)

        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF)], env=env, preexec_fn=join_cgroup
        )
        return Pool(name=name, address=address, process=process, fingerprint=self._fingerprint(name, self.plans[name]))

    def _wait_ready(self, pools: list[Pool]) -> list[Pool]:
        """Until each pool answers ready; a pool that exits first is left out (optional) or stops the host."""
        waiting = {pool.name: pool for pool in pools}
        self.starting = pools
        ready: list[Pool] = []
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while waiting:
            if any(signum != signal.SIGHUP for signum in self.signals):
                for pool in waiting.values():
                    self._stop_pool(pool)
                raise HostError("stopped while the models were starting")
            for name, pool in list(waiting.items()):
                if pool.process.poll() is not None:
                    del waiting[name]
                    problem = f"model {name}: its pool exited with status {pool.process.returncode} while starting"
                    if not self.settings.models[name].optional:
                        raise HostError(f"{problem} (its error is above)")
                    log.warning("%s; the other models serve without it (optional = true)", problem)
                    self.left_out[name] = "its pool did not start (see the log)"
                    continue
                if probe.probe(pool.address, f"/v2/models/{name}/ready", timeout=2.0) is None:
                    pool.routes = read_pool_routes(self.run.path, name) or ()
                    ready.append(pool)
                    del waiting[name]
                    self.starting = [p for p in self.starting if p is not pool]
            if waiting and time.monotonic() > deadline:
                raise HostError(f"models {', '.join(waiting)}: not ready after {READY_TIMEOUT_SECONDS:.0f} s")
            if waiting:
                self._sleep()
        return ready

    def _stop_pool(self, pool: Pool, sig: int = signal.SIGTERM) -> None:
        if pool.process.poll() is None:
            pool.process.send_signal(sig)

    # -- nginx ----------------------------------------------------------------------------

    def _nginx_files(self) -> Path:
        """Write the front door's files; returns nginx's main configuration."""
        folder = self.run.path / NGINX_DIR
        for name in TEMP_FOLDERS:
            (folder / "tmp" / name).mkdir(parents=True, exist_ok=True)
        nginx = self.settings.nginx
        explicit_log = "nginx.access_log" in self.loaded.sources and not self.loaded.sources[
            "nginx.access_log"
        ].startswith("default")
        settings = self.settings.model_copy(
            update={
                "nginx": nginx.model_copy(
                    update={
                        "listen": _listen(self.settings.server.bind),
                        "pidfile": str(folder / "nginx.pid"),
                        "access_log": nginx.access_log if explicit_log else "",
                    }
                )
            }
        )
        # In the file's order, not the order the pools got ready in: a route that several models'
        # tasks have (/predict), /docs and /openapi.json are the first model's.
        routes = [
            PoolRoute(
                name=name, aliases=entry.aliases, address=self.pools[name].address, routes=self.pools[name].routes
            )
            for name, entry in self.settings.models.items()
            if name in self.pools
        ]
        router = folder / "route_by_model.js"
        modules: list[Path] = []
        if needs_router(routes):
            module = js_module(self.binary)
            if module is None:
                raise HostError(
                    "several models take OpenAI embeddings: nginx routes them by the body's `model` with its js "
                    "module, which is not installed (Debian: apt-get install libnginx-mod-http-js)"
                )
            modules.append(module)
            router.write_text(router_script(routes), encoding="utf-8")
        site = folder / "onnxpool-site.conf"
        site.write_text(render_site(settings, pools=routes, router=router), encoding="utf-8")
        main = folder / "nginx.conf"
        main.write_text(render_main(settings, site, modules), encoding="utf-8")
        return main

    def _start_nginx(self) -> None:
        main = self._nginx_files()
        argv = [self.binary, "-p", str(main.parent), "-c", str(main), "-e", "stderr"]
        check = subprocess.run([*argv, "-t", "-q"], check=False, capture_output=True)
        if check.returncode != 0:
            sys.stderr.buffer.write(check.stderr)
            raise HostError(f"nginx refused the configuration in {main}")
        self.nginx = subprocess.Popen(argv)

    def _reload_nginx(self) -> None:
        main = self._nginx_files()
        check = subprocess.run(
            [self.binary, "-p", str(main.parent), "-c", str(main), "-t", "-q"], check=False, capture_output=True
        )
        if check.returncode != 0:
            log.error("reload: nginx refused %s: %s", main, check.stderr.decode(errors="replace").strip())
            return
        if self.nginx is not None and self.nginx.poll() is None:
            self.nginx.send_signal(signal.SIGHUP)

    # -- the registry the pools read ---------------------------------------------------------

    def _publish(self) -> None:
        models: list[HostModel] = []
        for name, entry in self.settings.models.items():
            pool, plan = self.pools.get(name), self.plans.get(name)
            models.append(
                HostModel(
                    name=name,
                    version=entry.version,
                    aliases=entry.aliases,
                    address=pool.address if pool else "",
                    state="READY" if pool else "UNAVAILABLE" if name in self.left_out or not plan else "LOADING",
                    reason="" if pool else self.left_out.get(name, ""),
                    budget=plan.budget if plan else 0.0,
                    workers=plan.layout.workers if plan else 0,
                    threads=plan.layout.threads if plan else 0,
                    priority=self.priority.describe(plan) if plan else "",
                    nice=plan.nice if plan and self.priority.kind == "nice" else 0,
                )
            )
        write_host(self.run.path, models)

    # -- life cycle -----------------------------------------------------------------------

    def notify(self, state: str) -> None:
        """systemd's readiness protocol (`Type=notify`): the host is the unit's main process, so it says
        READY=1 once the front door is up (its pools' masters would, but NotifyAccess=main ignores them)."""
        address = self.notify_socket
        if not address:
            return
        if address.startswith("@"):
            address = "\0" + address[1:]  # an abstract socket
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(state.encode(), address)

    def start(self) -> None:
        if self.priority.kind == "nice":
            log.info("budgets are held by nice values per worker (%s)", self.priority.why)
        self.plans = self._plan(self.loaded)
        self.priority.apply(self.plans.values())
        self._publish()  # the pools' workers read their nice value from it
        spawned = [self._spawn(name) for name in self.plans]
        ready = {pool.name: pool for pool in self._wait_ready(spawned)}
        self.pools = {name: ready[name] for name in self.plans if name in ready}  # the file's order
        self._publish()
        self._start_nginx()
        self.notify("READY=1")
        log.info(
            "front door: nginx on %s routes %d models: %s",
            self.settings.server.bind,
            len(self.pools),
            ", ".join(f"{name} -> {pool.address}" for name, pool in self.pools.items()),
        )

    def reload(self) -> None:
        """HUP: apply the re-read settings file to the pools that it changes, and only those."""
        try:
            loaded = load_settings(self.config_file, pool="")
            if not loaded.settings.models:
                raise ConfigError("the file no longer names several models ([models.<name>])")
            old_settings = self.loaded
            self.loaded = loaded
            try:
                plans = self._plan(loaded)
            except HostError:
                self.loaded = old_settings
                raise
        except (ConfigError, HostError, OSError) as exc:
            log.error("reload: keeping the running models: %s", exc)
            return
        old_plans, self.plans = self.plans, plans
        removed = [pool for name, pool in self.pools.items() if name not in plans]
        for pool in removed:
            del self.pools[pool.name]
        added = [name for name in plans if name not in self.pools]
        self.priority.apply(plans.values())
        self._publish()
        for name, pool in self.pools.items():
            fingerprint = self._fingerprint(name, plans[name])
            if fingerprint != pool.fingerprint:
                log.info("reload: model %s changed: its workers are replaced", name)
                pool.fingerprint = fingerprint
                pool.process.send_signal(signal.SIGHUP)
            elif self.priority.kind == "nice" and old_plans.get(name) and old_plans[name].nice != plans[name].nice:
                reniced = renice_workers(pool.process.pid, plans[name].nice)
                log.info("reload: model %s: nice %d for its %d workers (its neighbours' budgets changed)",
                         name, plans[name].nice, len(reniced))  # fmt: skip
        try:
            for pool in self._wait_ready([self._spawn(name) for name in added]):
                log.info("reload: model %s added", pool.name)
                self.pools[pool.name] = pool
        except HostError as exc:
            log.error("reload: %s", exc)
        self._publish()
        self._reload_nginx()
        for pool in removed:
            # nginx's new workers no longer route to it; its old ones finish what they hold.
            log.info("reload: model %s removed: its pool stops after its in-flight requests", pool.name)
            self._stop_pool(pool)
            self._wait_exit(pool.process, self.settings.server.graceful_timeout + 5)
            self.priority.remove(pool.name)

    def stop(self, graceful: bool = True) -> None:
        """nginx first (it finishes what it holds), then every pool."""
        if self.nginx is not None and self.nginx.poll() is None:
            self.nginx.send_signal(signal.SIGQUIT if graceful else signal.SIGTERM)
            self._wait_exit(self.nginx, self.settings.server.graceful_timeout + 5)
        pools = {id(pool): pool for pool in [*self.pools.values(), *self.starting]}.values()
        for pool in pools:
            self._stop_pool(pool, signal.SIGTERM if graceful else signal.SIGINT)
        for pool in pools:
            self._wait_exit(pool.process, self.settings.server.graceful_timeout + 5)
        self.priority.remove()
        self.run.remove()

    def _wait_exit(self, process: subprocess.Popen[bytes], seconds: float) -> None:
        try:
            process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _sleep(self) -> None:
        time.sleep(POLL_SECONDS)

    def serve(self) -> int:
        """Until a signal stops the host, or a pool or nginx dies (exit 1: the supervisor restarts it)."""
        while True:
            while self.signals:
                signum = self.signals.pop(0)
                if signum == signal.SIGHUP:
                    log.info("reload: re-reading %s", self.config_file)
                    self.notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
                    self.reload()
                    self.notify("READY=1")
                else:
                    log.info("stopping (%s): nginx first, then the pools", signal.Signals(signum).name)
                    self.notify("STOPPING=1")
                    self.stop(graceful=signum != signal.SIGINT)
                    return 0
            for name, pool in self.pools.items():
                if pool.process.poll() is not None:
                    log.error("model %s: its pool's master exited (status %s): stopping the host", name,
                              pool.process.returncode)  # fmt: skip
                    self.stop()
                    return 1
            if self.nginx is not None and self.nginx.poll() is not None:
                log.error("nginx exited (status %s): stopping the host", self.nginx.returncode)
                self.stop()
                return 1
            self._sleep()


def _priority(budgets: str) -> Priority:
    """`[server] budgets`: the mechanism that holds the budgets (workers/priority.py)."""
    if budgets == "nice":
        return Priority("nice", why="[server] budgets = nice")
    chosen = choose(f"{os.getpid()}")
    if budgets == "cgroup" and chosen.kind == "nice":
        raise HostError(f"[server] budgets = cgroup, but no cgroup can be made here: {chosen.why}")
    return chosen


def _read_raw(path: Path) -> dict[str, object]:
    import tomllib

    with path.open("rb") as handle:
        return tomllib.load(handle)


def _cores(cores: tuple[int, ...]) -> str:
    return ",".join(map(str, cores)) or "none"


def _listen(bind: str) -> str:
    """nginx's `listen` for `[server] bind` (`HOST:PORT` as it is, `unix:/path` too)."""
    return bind


def js_module(binary: str) -> Path | None:
    """nginx's js module file, from `nginx -V`'s modules path (Debian: /usr/lib/nginx/modules)."""
    try:
        text = subprocess.run([binary, "-V"], capture_output=True, text=True, check=False).stderr
    except OSError:
        return None
    found = re.search(r"--modules-path=(\S+)", text)
    folders = [Path(found.group(1))] if found else []
    folders.append(Path("/usr/lib/nginx/modules"))
    return next((folder / ROUTER_MODULE for folder in folders if (folder / ROUTER_MODULE).is_file()), None)


def serve_models(config_file: Path) -> int:
    """`onnxpool serve` with several models: returns the exit status."""
    try:
        loaded = load_settings(config_file, pool="")
    except ConfigError as exc:
        print(f"onnxpool: error: {exc}", file=sys.stderr)
        return 1
    logging.config.dictConfig(logs.logconfig_dict(loaded.settings.logging))
    binary = nginx_binary()
    if binary is None:
        print(
            "onnxpool: error: several models are served behind nginx (their one front door on [server] bind), "
            "and nginx is not installed (Debian: apt-get install nginx-light)",
            file=sys.stderr,
        )
        return 1
    try:
        host = Host(config_file, loaded, binary)
    except HostError as exc:
        print(f"onnxpool: error: {exc}", file=sys.stderr)
        return 1
    if loaded.settings.server.pidfile:
        Path(loaded.settings.server.pidfile).write_text(f"{os.getpid()}\n")

    def remember(signum: int, _frame: FrameType | None) -> None:
        host.signals.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(signum, remember)
    try:
        host.start()
    except HostError as exc:
        print(f"onnxpool: error: {exc}", file=sys.stderr, flush=True)
        host.stop(graceful=False)
        return 1
    status = host.serve()
    if loaded.settings.server.pidfile:
        Path(loaded.settings.server.pidfile).unlink(missing_ok=True)
    shutil.rmtree(host.run.path, ignore_errors=True)
    return status
