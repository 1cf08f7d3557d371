"""`onnxpool nginx` on a settings file with several models: the front door of a pod whose models
run in containers of their own (deploy/k8s/overlays/zoo).

In Kubernetes the platform supervises: the kubelet restarts a dead container alone, with back-off,
and stops the pod's containers. So the pod runs no supervisord; each part the host would start is a
container, all sharing one run folder ($ONNXPOOL_HOST_DIR, an emptyDir):
- one container per model: `onnxpool serve` with $ONNXPOOL_POOL=<name> on the same file, the
  one-model server on its socket in the shared folder (`pools/<name>.sock`), its CPU request its
  budget (the kubelet turns it into the container's cgroup weight);
- the host's routes: `onnxpool routes` (host/routes.py, reading the files below);
- this process, the nginx container's: it starts nginx on the front door's files and watches the
  models, as the host process does (host/controller.py) but with no programs of its own to start.

Watching: every POLL_SECONDS, a READY model's socket must accept a connection (a dead pool's does
not: its container is gone; busy workers never fail this, the listen queue takes it), and a model
that is not READY gets one probe of its pool's /v2/health/ready. Each model's state (READY, LOADING,
UNAVAILABLE with its pool's last error line) goes to host.json for the routes. nginx routes a model
from its first READY on (a restart then costs its own requests a 502/503, never a reload), and is
re-rendered (a HUP: its old workers finish what they hold) when the routable models change, or
when a HUP of this process read a file whose callers or quotas changed (config/nginx_callers.py).

Process rules: this process is the container's pid 1; nginx is its child, and with [server] grpc_bind
the host's gRPC router too (host/grpc_router.py: the pod's one gRPC port, routed by the model a call
names to the model's container at its [models.<name>] grpc_bind; started again if it exits). SIGTERM
(the kubelet, after preStop) becomes nginx's graceful QUIT and the router's TERM; HUP reads the
settings file again (nginx is HUPped only if its files changed); USR1 is passed on; the exit
status is nginx's. nginx exiting on its own ends this process too (the kubelet restarts the
container). The models' containers wait for nginx's pid file to go before they stop serving
([nginx] pidfile names it), as the one-model pod's onnxpool container does.
"""

from __future__ import annotations

import contextlib
import logging
import logging.config
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from onnxpool import logs
from onnxpool.config.callers import CallerBook
from onnxpool.config.loader import ENV_CONFIG_FILE, ENV_HOST_DIR, ConfigError, LoadedSettings, load_settings
from onnxpool.host.front_door import FrontDoorError, PoolRoute, front_door_callers, write_checked_front_door
from onnxpool.host.nginx_workers import await_new_workers, nginx_workers
from onnxpool.host.state import (
    NGINX_DIR,
    POOLS_DIR,
    HostModel,
    Reading,
    pool_error_file,
    pool_socket,
    read_pool_error,
    write_host,
)
from onnxpool.host.view import GRPC_ROUTER
from onnxpool.host.watcher import WatchedPool, answers_ready, follow_routes, set_state
from onnxpool.proxy import FORWARD, copy_lines, nginx_binary
from onnxpool.server.model_states import LOADING, READY, UNAVAILABLE

log = logging.getLogger("onnxpool.front")

POLL_SECONDS = 0.5
START_POLL_SECONDS = 0.05
"""While a model is not READY: it is routed sooner, the pod ready sooner."""
PROBE_SECONDS = 1.0
RELOAD_SECONDS = 5.0
RESTARTS = "the kubelet restarts its container"
PRIORITY = "its container's cpu request (cgroup weight)"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


@dataclass
class WatchedModel(WatchedPool):
    """One model's container as the front door sees it (its pool: host/watcher.py); `starts` counts its
    READYs (1, then one more per restart)."""

    ready_at: float = 0.0
    """Wall-clock time of its last READY: an error line written since is about this run."""
    refused: str = ""
    """Why nginx cannot route it (its js module missing): UNAVAILABLE for good."""

    def host_model(self) -> HostModel:
        return HostModel(
            name=self.name,
            version=self.entry.version,
            aliases=self.entry.aliases,
            address=self.address,
            grpc_address=self.entry.grpc_bind,
            state=self.state,
            reason=self.reason,
            required=not self.entry.optional,
            starts=self.starts,
            budget=self.entry.cpus if isinstance(self.entry.cpus, float) else 0.0,
            priority=PRIORITY,
        )


def accepts(address: str, timeout: float = PROBE_SECONDS) -> bool:
    """Something listens at `address` (a connection is accepted; no request is sent)."""
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: object = address[len("unix:") :]
    else:
        host, _, port = address.rpartition(":")
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        target = (host.strip("[]"), int(port))
    with sock:
        sock.settimeout(timeout)
        try:
            sock.connect(target)  # type: ignore[arg-type]
        except OSError:
            return False
    return True


class PodFrontDoor:
    def __init__(self, loaded: LoadedSettings, folder: Path, binary: str, config_file: Path | None = None) -> None:
        self.loaded = loaded
        self.config_file = config_file
        self.reread = False
        """A HUP came: read the file again (callers and quotas change the front door's files)."""
        self.routed_callers: CallerBook | None = None
        self.callers = front_door_callers(loaded.settings)
        """The file's callers and quotas as last read (at start and at each HUP, never between)."""
        self.reading = Reading(True, time.time())
        self.folder = folder
        self.binary = binary
        self.models = {
            name: WatchedModel(name, entry, entry.bind or pool_socket(folder, name))
            for name, entry in loaded.settings.models.items()
        }
        self.routed: tuple[PoolRoute, ...] | None = None
        self.nginx: subprocess.Popen[bytes] | None = None
        self.router: subprocess.Popen[bytes] | None = None
        """The gRPC router ([server] grpc_bind), this process's second child."""
        self.stopping = False

    @property
    def routes_address(self) -> str:
        return f"unix:{self.folder / 'routes.sock'}"  # as host/routes_conf.py binds

    def _error_since_ready(self, model: WatchedModel) -> str:
        """Its pool's last error line, when written after its last READY."""
        with contextlib.suppress(OSError):
            if pool_error_file(self.folder, model.name).stat().st_mtime > model.ready_at:
                return read_pool_error(self.folder, model.name)
        return ""

    def poll(self) -> bool:
        """One look at every model; True when a state changed."""
        changed = False
        for model in self.models.values():
            if model.refused:
                continue
            if model.state == READY and accepts(model.address):
                follow_routes(self.folder, model)  # a new description: nginx follows its routes
                continue
            if model.state != READY and answers_ready(self.folder, model):
                model.ready_at = time.time()
                model.starts += 1
                changed |= set_state(model, READY, "")
                continue
            error = self._error_since_ready(model)
            if error:
                changed |= set_state(model, UNAVAILABLE, f"{error} ({RESTARTS})")
            elif model.starts:
                changed |= set_state(model, UNAVAILABLE, f"its pool stopped answering ({RESTARTS})")
            else:
                changed |= set_state(model, LOADING, f"waiting for its pool at {model.address} (its container)")
        return changed

    def publish(self) -> None:
        models = [model.host_model() for model in self.models.values()]
        write_host(self.folder, models, self.reading, self.loaded.settings.server.graceful_timeout)

    def _routable(self) -> tuple[PoolRoute, ...]:
        return tuple(model.route() for model in self.models.values() if model.routed and not model.refused)

    def route(self) -> None:
        """Write nginx's files for the routable models, and start nginx or HUP it when they changed. A
        model nginx cannot route (its js module missing) is UNAVAILABLE; the others stay as they were."""
        pools = self._routable()
        callers = self.callers
        if pools == self.routed and callers == self.routed_callers:
            return
        try:
            main = write_checked_front_door(
                self.folder / NGINX_DIR, self.loaded, pools, self.routes_address, self.binary
            )
        except FrontDoorError as exc:
            known = {pool.name for pool in self.routed or ()}
            for pool in pools:
                if pool.name not in known:
                    model = self.models[pool.name]
                    model.refused = str(exc)
                    set_state(model, UNAVAILABLE, str(exc))
            self.publish()
            if self.routed is None:
                self.route()  # nginx starts without them
            return
        before = nginx_workers(self.nginx.pid if self.nginx is not None else 0)
        if self.nginx is None:
            self._start_nginx(main)
        else:
            self.nginx.send_signal(signal.SIGHUP)
        # A model is READY in host.json only once nginx routes to it (its new workers, the old ones gone):
        # the pod's readiness never runs ahead of its front door.
        assert self.nginx is not None
        await_new_workers(self.nginx.pid, before, RELOAD_SECONDS)
        self.routed = pools
        self.routed_callers = callers

    def _read_again(self) -> None:
        """After a HUP: the file's settings (a changed caller or quota is re-rendered by `route`)."""
        self.reread = False
        if self.config_file is None:
            return
        try:
            loaded = load_settings(self.config_file, pool="")
            self.callers = front_door_callers(loaded.settings)
        except (ConfigError, FrontDoorError) as exc:
            self.reading = Reading(False, time.time(), str(exc))
            log.error("reload: refused, the front door keeps its settings: %s", exc)
        else:
            self.loaded, self.reading = loaded, Reading(True, time.time())
        self.publish()

    def _start_nginx(self, main: Path) -> None:
        # nginx's stdout is a pipe of ours, copied to our stdout (as `onnxpool nginx` for one model: an
        # access log a non-root nginx re-opens must be its own).
        argv = [self.binary, "-p", str(main.parent), "-c", str(main), "-e", "stderr"]
        self.nginx = subprocess.Popen(argv, stdout=subprocess.PIPE)
        threading.Thread(target=copy_lines, args=(self.nginx.stdout, sys.stdout.buffer), daemon=True).start()
        log.info("front door: nginx on %s", self.loaded.settings.server.bind)

    def _keep_router(self) -> None:
        """With [server] grpc_bind: the host's gRPC router (host/grpc_router.py) runs beside nginx, reading
        host.json; one that exited is started again (the kubelet restarts only the container's pid 1)."""
        grpc_bind = self.loaded.settings.server.grpc_bind
        if not grpc_bind or (self.router is not None and self.router.poll() is None) or self.stopping:
            return
        if self.router is not None:
            log.error("gRPC router exited (status %s): started again", self.router.returncode)
        else:
            for name, model in self.models.items():
                if not model.entry.grpc_bind:
                    log.warning("model %s: no [models.%s] grpc_bind: its gRPC calls are refused", name, name)
        env = {**os.environ, ENV_HOST_DIR: str(self.folder)}
        if self.config_file is not None:
            env[ENV_CONFIG_FILE] = str(self.config_file)
        self.router = subprocess.Popen([sys.executable, "-m", GRPC_ROUTER], env=env)

    def _stop_router(self, grace: float) -> None:
        if self.router is None or self.router.poll() is not None:
            return
        self.router.send_signal(signal.SIGTERM)  # it finishes the calls in flight
        try:
            self.router.wait(grace)
        except subprocess.TimeoutExpired:
            self.router.kill()
            self.router.wait()

    def serve(self) -> int:
        """Until nginx exits (its status; 128 + a signal's number when one killed it)."""
        self.publish()
        self.route()
        assert self.nginx is not None
        self._keep_router()

        def forward(signum: int, _frame: FrameType | None) -> None:
            if signum == signal.SIGHUP and self.config_file is not None:
                self.reread = True  # the loop reads the file, re-renders and HUPs nginx if that changed it
                return
            if signum in STOP_SIGNALS:
                self.stopping = True
                if self.router is not None and self.router.poll() is None:
                    self.router.send_signal(signal.SIGTERM)
            if self.nginx is not None and self.nginx.poll() is None:
                self.nginx.send_signal(FORWARD[signal.Signals(signum)])

        for signum in FORWARD:
            signal.signal(signum, forward)
        while self.nginx.poll() is None:
            if self.reread:
                self._read_again()
            changed = self.poll()
            self.route()  # before the states are published: READY is routed
            if changed:
                self.publish()
            self._keep_router()
            settling = any(model.state != READY and not model.refused for model in self.models.values())
            time.sleep(START_POLL_SECONDS if settling else POLL_SECONDS)
        self._stop_router(self.loaded.settings.server.graceful_timeout + 5)
        code = self.nginx.returncode
        return code if code >= 0 else 128 - code


def serve_front_door(config_file: Path) -> int:
    """`onnxpool nginx` with several models: returns the exit status."""
    try:
        loaded = load_settings(config_file, pool="")
    except ConfigError as exc:
        print(f"onnxpool: error: {exc}", file=sys.stderr)
        return 1
    logging.config.dictConfig(logs.logconfig_dict(loaded.settings.logging))
    folder = os.environ.get(ENV_HOST_DIR)
    if not folder:
        print(f"onnxpool: error: set ${ENV_HOST_DIR}: the run folder the pod's containers share", file=sys.stderr)
        return 1
    binary = nginx_binary()
    if binary is None:
        print("onnxpool: error: nginx is not installed (Debian: apt-get install nginx-light)", file=sys.stderr)
        return 1
    path = Path(folder)
    # nginx started as root runs its workers as `nobody`: they reach the sockets through these folders.
    for part in (path, path / POOLS_DIR, path / NGINX_DIR):
        part.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(PermissionError):
            part.chmod(0o711)
    try:
        return PodFrontDoor(loaded, path, binary, config_file).serve()
    except (FrontDoorError, OSError) as exc:
        print(f"onnxpool: error: {exc}", file=sys.stderr, flush=True)
        return 1
