"""Real deployments for tests and benchmarks: nginx in front of onnxpool instances.

- `start_nginx` runs the nginx binary with the site `onnxpool nginx-config`
  renders, in its own prefix dir (pid, logs, temp files there), `daemon off`,
  in its own session, on a free loopback port; `Nginx.stop` ends its group.
- `start_instance` runs one onnxpool (gunicorn) on a given address, optionally
  inside a network namespace and pinned to given cores.
- `host_addresses(n)` gives n addresses that look like separate hosts: one
  network namespace each with a veth pair into this namespace (10.123.X.0/30
  subnets created here), when running as root with `ip netns`; otherwise
  127.0.0.2, 127.0.0.3, ... Namespaces and links it made are always deleted.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from onnxpool.config.nginx import render_site
from onnxpool.config.settings import NginxSettings, ServerSettings, Settings
from onnxpool.measure.paths import GUNICORN_CONF
from tests.harness import Server, clean_env, free_port, spawn_logged


def nginx_binary() -> str | None:
    """The nginx executable, or None (Debian puts it in /usr/sbin, often not on a user's PATH)."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin:/usr/local/nginx/sbin")


def wait_port(host: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")


def stop_group(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
    """Signal the process group led by `process` (ours: start_new_session), then SIGKILL what is left."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5)


def stop_together(*processes: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM to each of `processes` at once (as the kubelet stops a pod's containers), then wait for each;
    one that outlives `timeout` is killed."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- nginx ----------------------------------------------------------------------------------------

MAIN_CONF = """\
daemon off;
master_process on;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
{user}
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    include {site};
}}
"""


@dataclass
class Nginx:
    """A running nginx (master + 1 worker) in its own prefix dir."""

    process: subprocess.Popen[bytes]
    port: int
    prefix: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def error_log(self) -> str:
        return (self.prefix / "error.log").read_text(errors="replace")

    def access_log(self) -> list[str]:
        path = self.prefix / "access.log"
        return path.read_text(errors="replace").splitlines() if path.exists() else []

    def wait_for_log_line(self, text: str, timeout: float = 5.0) -> bool:
        """True once an access-log line contains `text`.

        nginx writes the line when it finalises the request, which can be a moment
        after the client has read the whole reply, so a test must not read the log once.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.access_log()):
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        stop_group(self.process, signal.SIGQUIT)  # graceful: finish what is in flight


def start_nginx(tmp_path: Path, upstreams: Sequence[str], server: ServerSettings | None = None) -> Nginx:
    """nginx with the rendered onnxpool site in front of `upstreams`, on a free 127.0.0.1 port."""
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError("nginx is not installed")
    prefix = tmp_path / f"nginx-{free_port()}"
    (prefix / "tmp").mkdir(parents=True)
    port = free_port()
    settings = Settings(
        server=server or ServerSettings(),
        nginx=NginxSettings(
            listen=f"127.0.0.1:{port}", upstreams=tuple(upstreams), access_log=str(prefix / "access.log")
        ),
    )
    site = prefix / "onnxpool.conf"
    site.write_text(render_site(settings))
    # As root the master would switch its workers to `nobody`, who cannot read our tmp dirs.
    user = "user root;" if os.geteuid() == 0 else ""
    main = prefix / "nginx.conf"
    main.write_text(MAIN_CONF.format(prefix=prefix, site=site, user=user))
    with (prefix / "stdout.log").open("wb") as out:
        process = subprocess.Popen(
            [binary, "-p", str(prefix), "-c", str(main), "-e", str(prefix / "error.log")],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    nginx = Nginx(process=process, port=port, prefix=prefix)
    try:
        wait_port("127.0.0.1", port)
    except BaseException:
        nginx.stop()
        raise RuntimeError(f"nginx did not start: {(prefix / 'stdout.log').read_text()}\n{nginx.error_log()}") from None
    return nginx


# --- onnxpool instances ---------------------------------------------------------------------------


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a unix socket (checks an instance bound to unix:/path directly)."""

    def __init__(self, path: str, timeout: float = 5.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


@dataclass
class Instance(Server):
    """An onnxpool instance on any address: TCP `host:port` (maybe in a namespace) or a unix socket."""

    @property
    def upstream(self) -> str:
        """The address nginx uses to reach this instance."""
        return self.bind if self.bind.startswith("unix:") else f"{self.host}:{self.port}"

    def is_ready(self) -> bool:
        if self.bind.startswith("unix:"):
            return _answers_ready(UnixHTTPConnection(self.bind[len("unix:") :]))
        try:
            with socket.create_connection((self.host, self.port), timeout=2):
                pass
        except OSError:
            return False
        return _answers_ready(http.client.HTTPConnection(self.host, self.port, timeout=5))


def _answers_ready(connection: http.client.HTTPConnection) -> bool:
    """GET /v2/health/ready over `connection` (TCP or unix socket) is 200."""
    try:
        connection.request("GET", "/v2/health/ready")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def start_instance(
    tmp_path: Path,
    bind: str,
    settings: Mapping[str, str] | None = None,
    *,
    workers: int = 1,
    namespace: str | None = None,
    cores: Sequence[int] | None = None,
    wait: bool = True,
    name: str = "instance",
) -> Instance:
    """One onnxpool (gunicorn, `workers` workers) bound to `bind`, as its own process group.

    `namespace`: run inside that network namespace (`ip netns exec`, which execs,
    so the pid is gunicorn's master). `cores`: start it under `taskset` so
    instances sharing a machine do not all pin their slot 0 to core 0.
    """
    env = clean_env({"ONNXPOOL_SERVER__WORKERS": str(workers), **(settings or {})})
    env["ONNXPOOL_SERVER__BIND"] = bind
    env.setdefault("PYTHONUNBUFFERED", "1")
    argv = [sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF)]
    if cores is not None:
        argv = ["taskset", "-c", ",".join(map(str, cores)), *argv]
    if namespace is not None:
        argv = ["ip", "netns", "exec", namespace, *argv]
    host, port = ("", 0)
    if not bind.startswith("unix:"):
        host, _, port_text = bind.rpartition(":")
        port = int(port_text)
    log_path = tmp_path / f"{name}.log"
    process = spawn_logged(argv, log_path, env)
    instance = Instance(process=process, port=port, log_path=log_path, env=env, bind=bind, host=host)
    if wait:
        try:
            instance.wait_ready(workers)
        except BaseException:
            instance.stop()
            raise
    return instance


# --- addresses that look like separate hosts ------------------------------------------------------


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)


def _free_subnet_octet() -> int:
    """A third octet X such that no local address is in 10.123.X.0/24 yet."""
    used = _ip("-o", "-4", "addr", "show").stdout
    candidates = list(range(1, 255))
    random.shuffle(candidates)
    for octet in candidates:
        if f" 10.123.{octet}." not in used:
            return octet
    raise RuntimeError("no free 10.123.X.0/24 subnet")


@dataclass(frozen=True)
class Host:
    """Where an instance runs: an address, and the namespace it lives in (None = this one)."""

    address: str
    namespace: str | None


@contextlib.contextmanager
def host_addresses(count: int, use_namespaces: bool | None = None) -> Iterator[list[Host]]:
    """`count` hosts: network namespaces with their own address if possible, else loopback aliases.

    `use_namespaces` defaults to yes unless $DEPLOY_TESTS_NETNS is "0" (to test the fallback).
    """
    if use_namespaces is None:
        use_namespaces = os.environ.get("DEPLOY_TESTS_NETNS", "1") != "0"
    made_ns: list[str] = []
    made_links: list[str] = []
    try:
        hosts = _namespaced_hosts(count, made_ns, made_links) if use_namespaces else None
        yield hosts or [Host(f"127.0.0.{2 + i}", None) for i in range(count)]
    finally:
        for ns in made_ns:
            _ip("netns", "del", ns)
        for link in made_links:  # normally gone with its peer's namespace
            if _ip("link", "show", link).returncode == 0:
                _ip("link", "del", link)


def namespaces_usable() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("taskset") is not None


def _namespaced_hosts(count: int, made_ns: list[str], made_links: list[str]) -> list[Host] | None:
    """Namespaces onxp<pid>n<i>, each with veth onxp<pid>v<i> <-> eth0, 10.123.X.(4i+1|2)/30; None on failure."""
    if not namespaces_usable():
        return None
    tag = f"onxp{os.getpid() % 100000}"
    octet = _free_subnet_octet()
    hosts = []
    for i in range(count):
        ns, link = f"{tag}n{i}", f"{tag}v{i}"
        outer, inner = f"10.123.{octet}.{4 * i + 1}", f"10.123.{octet}.{4 * i + 2}"
        if _ip("netns", "add", ns).returncode != 0:
            return None
        made_ns.append(ns)
        steps = [
            ("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns),
            ("addr", "add", f"{outer}/30", "dev", link),
            ("link", "set", link, "up"),
            ("-n", ns, "addr", "add", f"{inner}/30", "dev", "eth0"),
            ("-n", ns, "link", "set", "eth0", "up"),
            ("-n", ns, "link", "set", "lo", "up"),
        ]
        for step in steps:
            if _ip(*step).returncode != 0:
                return None
            if step[:2] == ("link", "add"):
                made_links.append(link)
        hosts.append(Host(inner, ns))
    return hosts
