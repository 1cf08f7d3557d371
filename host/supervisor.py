"""supervisord for a host serving several models: its configuration, and the calls the host makes.

supervisord (PyPI `supervisor`) runs every process of the host but the host itself and its janitor
(host/program.py): the host's routes, one gunicorn pool per model, and nginx (started by the host
once the pools are ready; stopped first). Each program's section holds only what is fixed for the
host's life (a changed section would be a restarted program): what a reload changes reaches the
programs by their HUP. What it does that the host does
not: restart a program that dies, alone, with a growing back-off; stop a program's whole process
group (`killasgroup`) when it does not stop in time; start programs in priority order and stop
them in the reverse order, each group stopped before the next. The host talks to it over its
XML-RPC control socket in the run folder (owner-only), as supervisorctl does.

Each program's command is `python -m onnxpool.host.program exec ... -- COMMAND` (host/program.py):
leftovers of its previous run stopped, its process group recorded, its model's cgroup joined,
supervisord's death forwarded.
"""

from __future__ import annotations

import http.client
import os
import shlex
import sys
import time
import xmlrpc.client
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

ROUTES = "routes"
GRPC = "grpc"
"""The host's gRPC router (host/grpc_router.py), with `[server] grpc_bind` only."""
NGINX = "nginx"
POOL_PREFIX = "model-"
"""A model's program is `model-<name>` (a model's name is URL-safe: letters, digits, `-`, `_`, `.`)."""

PRIORITY = {ROUTES: 10, GRPC: 20, NGINX: 900}
POOL_PRIORITY = 100
START_RETRIES = 3
"""A program that exits while starting is started again 3 times (after 1, 2, 3 s), then FATAL (the
host then starts a pool again itself, with a capped back-off: host/controller.py)."""
STOP_BACKSTOP_SECONDS = 3600
"""stopwaitsecs of every program: a backstop only. A section holds nothing a reload may change (a
changed section is a program restarted), and each program bounds its own stop by the host's current
graceful_timeout (gunicorn's graceful_timeout, nginx's worker_shutdown_timeout); the host stops
them itself, every pool at once, and kills what outlives graceful_timeout + 5 s."""
CALL_SECONDS = 10.0
CALL_ERRORS = (OSError, xmlrpc.client.Error, http.client.HTTPException)
"""What a call raises when supervisord is starting, stopping or gone."""
USERNAME = "onnxpool"

# supervisord's process states (supervisor.states.ProcessStates), as its XML-RPC names them.
RUNNING_STATES = frozenset({"STARTING", "RUNNING"})
FAILED_STATES = frozenset({"BACKOFF", "FATAL", "EXITED", "UNKNOWN"})
STOPPING_STATES = frozenset({"STARTING", "RUNNING", "STOPPING"})
"""A program told to stop is not gone yet in these."""


def pool_program(model: str) -> str:
    return f"{POOL_PREFIX}{model}"


@dataclass(frozen=True)
class Program:
    """One [program:x] section."""

    name: str
    command: Sequence[str]
    priority: int
    environment: Mapping[str, str] = field(default_factory=dict)
    autostart: bool = True
    stopsignal: str = "TERM"
    stopwaitsecs: float = STOP_BACKSTOP_SECONDS
    startsecs: int = 1
    autorestart: bool = True

    def section(self) -> str:
        lines = [
            f"[program:{self.name}]",
            f"command={_escape(shlex.join(self.command))}",
            f"priority={self.priority}",
            f"autostart={str(self.autostart).lower()}",
            f"autorestart={'true' if self.autorestart else 'false'}",
            f"startsecs={self.startsecs}",
            f"startretries={START_RETRIES}",
            f"stopsignal={self.stopsignal}",
            f"stopwaitsecs={max(1, round(self.stopwaitsecs))}",
            # The whole group (a pool's workers, nginx's) is killed when the program outlives stopwaitsecs.
            "stopasgroup=false",
            "killasgroup=true",
            # Its output is the host's (journald, kubectl logs): the program writes there itself once the
            # host handed it the host's own (host/program.py); until then supervisord passes it on.
            "redirect_stderr=true",
            "stdout_logfile=/dev/stdout",
            "stdout_logfile_maxbytes=0",
        ]
        if self.environment:
            pairs = ",".join(f'{key}="{_escape(value)}"' for key, value in self.environment.items())
            lines.append(f"environment={pairs}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    """supervisord expands `%(name)s` in values: a literal `%` is `%%`."""
    if '"' in value or "\n" in value:
        raise ValueError(f"cannot pass {value!r} to supervisord (a quote or a line break)")
    return value.replace("%", "%%")


def wrapped(
    run_dir: Path, name: str, command: Sequence[str], cgroup: Path | None = None, hand_over: bool = False
) -> list[str]:
    """`command` started through host/program.py (module doc), writing its output itself."""
    argv = [
        *(sys.executable, "-m", "onnxpool.host.program", "exec"),
        *("--group-file", str(group_file(run_dir, name)), "--output-socket", str(output_socket(run_dir))),
    ]
    if cgroup is not None:
        argv += ["--cgroup", str(cgroup)]
    if hand_over:
        argv.append("--hand-over")
    return [*argv, "--", *command]


def output_socket(run_dir: Path) -> Path:
    """Where the host hands its stdout and stderr to the programs (host/program.py)."""
    return run_dir / "output.sock"


def group_file(run_dir: Path, program: str) -> Path:
    return run_dir / "programs" / f"{program}.pgid"


def socket_path(run_dir: Path) -> Path:
    return run_dir / "supervisor" / "supervisor.sock"


def render(run_dir: Path, programs: Sequence[Program], password: str) -> str:
    """supervisord.conf: in the foreground, its control socket (owner-only, and a password the host
    made for this run) and pid file in the run folder."""
    folder = run_dir / "supervisor"
    # As root, supervisord asks to be told so (it would otherwise log a CRIT line at every start).
    user = "user=root\n" if os.geteuid() == 0 else ""
    head = f"""; Written by onnxpool for the host in {_escape(str(run_dir))}; rewritten at every reload.
[supervisord]
{user}nodaemon=true
silent=true
logfile=/dev/stdout
logfile_maxbytes=0
loglevel=warn
pidfile={_escape(str(folder / "supervisord.pid"))}
childlogdir={_escape(str(folder))}

[unix_http_server]
file={_escape(str(socket_path(run_dir)))}
chmod=0700
username={USERNAME}
password={password}

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

"""
    return head + "\n".join(program.section() for program in programs)


class Supervisor:
    """The host's calls to its supervisord, over the control socket."""

    def __init__(self, run_dir: Path, password: str) -> None:
        self.url = f"unix://{socket_path(run_dir)}"
        self.password = password
        self._proxy = self._connect()

    def _connect(self) -> xmlrpc.client.ServerProxy:
        from supervisor.xmlrpc import SupervisorTransport  # the host process only

        transport = SupervisorTransport(USERNAME, self.password, serverurl=self.url)
        connection = transport._get_connection

        def timed_connection() -> Any:
            """supervisor's unix connection sets no timeout: a hung supervisord would hang the host."""
            made = connection()
            connect = made.connect

            def connect_with_timeout() -> None:
                connect()
                made.sock.settimeout(CALL_SECONDS)

            made.connect = connect_with_timeout
            return made

        transport._get_connection = timed_connection
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)

    @property
    def api(self) -> Any:
        return self._proxy.supervisor

    def reconnect(self) -> None:
        """A call that failed half-way leaves the transport's connection unusable: start a new one."""
        self._proxy = self._connect()

    def wait_running(self, alive: Any, seconds: float = CALL_SECONDS) -> None:
        """Until supervisord answers (its socket is made after it reads its configuration)."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                if self.api.getState()["statename"] == "RUNNING":
                    return
            except CALL_ERRORS:
                self.reconnect()
            if not alive() or time.monotonic() > deadline:
                raise OSError("supervisord did not start (its error is above)")
            time.sleep(0.05)

    def states(self) -> dict[str, dict[str, Any]]:
        """Each program's state: statename, pid, exitstatus, spawnerr..."""
        return {info["name"]: info for info in cast(list[dict[str, Any]], self.api.getAllProcessInfo())}

    def start(self, program: str) -> None:
        self.api.startProcess(program, False)

    def stop(self, program: str) -> None:
        """Its stop signal, without waiting (not running: nothing to do)."""
        try:
            self.api.stopProcess(program, False)
        except xmlrpc.client.Fault:
            pass

    def stop_in_waves(self, first: list[str], then: list[str], hand_over: float, seconds: float) -> list[str]:
        """Stop `first` (nginx: it stops taking connections at once and passes on what it has read), and
        `hand_over` s later (or once they are gone) every program of `then` at once: each finishes what it
        holds (nginx relays those replies). Returns the programs still stopping after `seconds` in all."""
        t0 = time.monotonic()
        deadline = t0 + seconds
        for program in first:
            self.stop(program)
        self._await_stopped(first, min(deadline, t0 + hand_over))
        for program in then:
            self.stop(program)
        return self._await_stopped([*first, *then], deadline)

    def _await_stopped(self, programs: list[str], deadline: float) -> list[str]:
        while True:
            states = self.states()
            left = [p for p in programs if states.get(p, {}).get("statename") in STOPPING_STATES]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.05)

    def signal(self, program: str, name: str) -> None:
        self.api.signalProcess(program, name)

    def update(self) -> tuple[list[str], list[str], list[str]]:
        """supervisorctl's `update`, first half: re-read the configuration file; (added, changed, removed)."""
        added, changed, removed = cast(list[list[list[str]]], self.api.reloadConfig())[0]
        return added, changed, removed

    def add(self, program: str) -> None:
        self.api.addProcessGroup(program)

    def remove(self, program: str) -> None:
        """Stop the program (its stop signal, then its group killed after stopwaitsecs) and forget it."""
        try:
            self.api.stopProcessGroup(program, True)
        except xmlrpc.client.Fault:
            pass
        self.api.removeProcessGroup(program)
