"""Start and stop REAL onnxpool servers (gunicorn) for benchmarks, `onnxpool tune` and tests.

Each server runs in its own session (setsid), binds a free loopback port, and
is stopped by killing exactly its own process group: never pkill. `tests/harness.py`
re-exports these names for the test suite.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import requests

from onnxpool.measure.paths import CAT_JPEG, DATA, DEMO_MODEL, GUNICORN_CONF, MODEL_NAME

__all__ = ["CAT_JPEG", "DATA", "DEMO_MODEL", "MODEL_NAME"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_with_free_lanes(lanes: int) -> int:
    """A free port whose next `lanes` ports are free too (the lanes of a TCP bind)."""
    for _ in range(50):
        port = free_port()
        if port + lanes > 65535:
            continue
        probes = [socket.socket() for _ in range(lanes)]
        try:
            for number, probe in enumerate(probes, port + 1):
                probe.bind(("127.0.0.1", number))
            return port
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise RuntimeError("no port with free neighbours")


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The current environment without onnxpool settings (nor the OTEL_* variables that turn tracing on
    and shape it: `[tracing]`), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONNXPOOL_", "OTEL_"))}
    env.update(extra or {})
    return env


def children_of(pid: int) -> list[int]:
    """Direct children of a process, from /proc (gunicorn workers of a master)."""
    kids: list[int] = []
    with contextlib.suppress(FileNotFoundError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError):
                kids.extend(int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    return sorted(kids)


def cpu_seconds(pids: Iterable[int]) -> float:
    """utime + stime of these processes so far (/proc/<pid>/stat, ticks -> seconds); one gone meanwhile counts 0."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def proc_status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a dict (Cpus_allowed_list, Threads, VmRSS...)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def parse_cpu_list(text: str) -> set[int]:
    """'0-2,5' -> {0, 1, 2, 5}."""
    cores: set[int] = set()
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cores.update(range(int(lo), int(hi) + 1))
        elif part:
            cores.add(int(part))
    return cores


@dataclass
class Server:
    """A running gunicorn master serving onnxpool."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    bind: str = ""
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def workers(self) -> list[int]:
        return children_of(self.pid)

    def ready_workers(self) -> list[int]:
        """Worker pids that logged 'worker ready' and are still alive."""
        alive = set(self.workers())
        ready = []
        for line in self.log().splitlines():
            if "worker ready:" in line and "pid=" in line:
                pid = int(line.split("pid=")[1].split()[0])
                if pid in alive:
                    ready.append(pid)
        return sorted(set(ready))

    def is_ready(self) -> bool:
        """The server answers /v2/health/ready with 200 (subclasses reach it other ways)."""
        with contextlib.suppress(requests.RequestException):
            return requests.get(self.url + "/v2/health/ready", timeout=2).status_code == 200
        return False

    def wait_ready(self, workers: int, timeout: float = 60.0, exclude: set[int] | None = None) -> list[int]:
        """Wait until `workers` workers (not in exclude) are warmed up and the server answers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            ready = [p for p in self.ready_workers() if p not in (exclude or set())]
            if len(ready) >= workers and self.is_ready():
                return ready
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log()}")

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the process group, then SIGKILL it if it lingers."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # stragglers of OUR group only
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        return self.process.returncode


def spawn_logged(
    argv: list[str], log_path: Path, env: Mapping[str, str], cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start `argv` in its own session (process group), stdout+stderr to `log_path`.

    It runs in `cwd`, by default the log's folder: an installed onnxpool needs no checkout to run from.
    """
    with log_path.open("wb") as log_file:
        return subprocess.Popen(
            argv,
            cwd=cwd or log_path.parent,
            env=dict(env),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def start_server(
    tmp_path: Path,
    settings: Mapping[str, str] | None = None,
    *,
    workers: int | None = None,
    wait: bool = True,
    config: Path | None = None,
    bind: str | None = None,
    name: str = "server",
    timeout: float = 60.0,
    cpus: str | None = None,
    lanes: int = 0,
) -> Server:
    """Start `python -m gunicorn -c <onnxpool's gunicorn_conf.py>` on a free port, as its own process group.

    `settings` are ONNXPOOL_* environment overrides, e.g. {"ONNXPOOL_SERVER__WORKERS": "2"};
    `cpus` starts it under `taskset -c CPUS`, like an operator limiting its cores; `lanes`: the ports after
    its own are free too (callers' lanes, [callers] lanes).
    """
    port = port_with_free_lanes(lanes) if lanes else free_port()
    env = clean_env(settings)
    env["ONNXPOOL_SERVER__BIND"] = bind or f"127.0.0.1:{port}"
    if config is not None:
        env["ONNXPOOL_CONFIG"] = str(config)
    env.setdefault("PYTHONUNBUFFERED", "1")
    log_path = tmp_path / f"{name}-{port}.log"
    argv = [*(["taskset", "-c", cpus] if cpus else []), sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF)]
    process = spawn_logged(argv, log_path, env)
    server = Server(process=process, port=port, log_path=log_path, env=env, bind=env["ONNXPOOL_SERVER__BIND"])
    if wait:
        try:
            server.wait_ready(workers or len(parse_cpu_list(cpus) if cpus else os.sched_getaffinity(0)), timeout)
        except BaseException:
            server.stop()
            raise
    return server


@contextlib.contextmanager
def running_server(tmp_path: Path, settings: Mapping[str, str] | None = None, **kwargs: object) -> Iterator[Server]:
    """`with running_server(tmp_path, {...}) as server:` — always stopped afterwards."""
    server = start_server(tmp_path, settings, **kwargs)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()


def wait_http_ok(url: str, process: subprocess.Popen[bytes], log_path: Path, timeout: float = 60.0) -> None:
    """Wait until GET `url` answers 200, failing early (with the log) if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log_path.read_text(errors='replace')}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s:\n{log_path.read_text(errors='replace')}")


def start_command(
    argv: list[str],
    log_dir: Path,
    port: int,
    ready_path: str,
    *,
    env: Mapping[str, str] | None = None,
    name: str = "server",
    timeout: float = 60.0,
    cwd: Path | None = None,
) -> Server:
    """Start any HTTP server command (e.g. the uvicorn baseline) in its own process group.

    The command must listen on 127.0.0.1:`port`; this returns once GET `ready_path` answers 200.
    Stop it with `Server.stop()` (its process group only).
    """
    log_path = log_dir / f"{name}-{port}.log"
    process = spawn_logged(argv, log_path, clean_env(env), cwd)
    server = Server(process=process, port=port, log_path=log_path, bind=f"127.0.0.1:{port}")
    try:
        wait_http_ok(server.url + ready_path, process, log_path, timeout)
    except BaseException:
        server.stop()
        raise
    return server
