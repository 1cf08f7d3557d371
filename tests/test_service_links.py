"""What the platform puts in the environment never stops a start (issue 42, point 10).

The kubelet gives every pod variables for each Service of its namespace (service links), named
after the Service: a Service `onnxpool`, or KServe's `onnxpool-demo-predictor`, puts
ONNXPOOL_PORT=tcp://10.96.0.12:8000 and a dozen more beside our settings. They are ignored with
one info line; a misspelt setting is still refused with the same message as before.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import requests

from onnxpool.cli import main as onnxpool_main
from onnxpool.config.loader import ConfigError, is_service_link, load_settings
from onnxpool.measure.servers import start_command
from tests.harness import Server, clean_env, free_port, spawn_logged

PORTS = (("http", 8000, "TCP"), ("grpc", 8001, "TCP"))
"""The Services' ports: named, as KServe's predictor Service names them."""
IGNORED = "taken for a platform's service-link variables"
UNKNOWN = "unknown setting in environment variable"


def kubelet_variables(service: str, cluster_ip: str, ports: Sequence[tuple[str, int, str]] = PORTS) -> dict[str, str]:
    """What the kubelet puts in a pod's environment for one Service (pkg/kubelet/envvars, FromServices)."""
    name = service.upper().replace("-", "_")
    env = {f"{name}_SERVICE_HOST": cluster_ip, f"{name}_SERVICE_PORT": str(ports[0][1])}
    for port_name, number, _ in ports:
        if port_name:
            env[f"{name}_SERVICE_PORT_{port_name.upper().replace('-', '_')}"] = str(number)
    for index, (_, number, protocol) in enumerate(ports):
        host_port = f"[{cluster_ip}]:{number}" if ":" in cluster_ip else f"{cluster_ip}:{number}"  # net.JoinHostPort
        url = f"{protocol.lower()}://{host_port}"
        if index == 0:
            env[f"{name}_PORT"] = url  # docker's special case of the first port
        prefix = f"{name}_PORT_{number}_{protocol.upper()}"
        env.update({prefix: url, f"{prefix}_PROTO": protocol.lower(), f"{prefix}_PORT": str(number)})
        env[f"{prefix}_ADDR"] = cluster_ip
    return env


def platform_environment() -> dict[str, str]:
    """A pod's service links for the Kubernetes API and both Services named like onnxpool."""
    return {
        **kubelet_variables("kubernetes", "10.96.0.1", [("https", 443, "TCP")]),
        **kubelet_variables("onnxpool", "10.96.0.12"),
        **kubelet_variables("onnxpool-demo-predictor", "10.96.0.13"),
    }


def refusal(environ: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ=environ)
    return str(caught.value)


def test_the_kubelet_writes_thirteen_variables_for_such_a_service() -> None:
    """The helper writes what a pod's `env` shows for a Service with ports http 8000 and grpc 8001."""
    assert kubelet_variables("onnxpool", "10.96.0.12") == {
        "ONNXPOOL_SERVICE_HOST": "10.96.0.12",
        "ONNXPOOL_SERVICE_PORT": "8000",
        "ONNXPOOL_SERVICE_PORT_HTTP": "8000",
        "ONNXPOOL_SERVICE_PORT_GRPC": "8001",
        "ONNXPOOL_PORT": "tcp://10.96.0.12:8000",
        "ONNXPOOL_PORT_8000_TCP": "tcp://10.96.0.12:8000",
        "ONNXPOOL_PORT_8000_TCP_PROTO": "tcp",
        "ONNXPOOL_PORT_8000_TCP_PORT": "8000",
        "ONNXPOOL_PORT_8000_TCP_ADDR": "10.96.0.12",
        "ONNXPOOL_PORT_8001_TCP": "tcp://10.96.0.12:8001",
        "ONNXPOOL_PORT_8001_TCP_PROTO": "tcp",
        "ONNXPOOL_PORT_8001_TCP_PORT": "8001",
        "ONNXPOOL_PORT_8001_TCP_ADDR": "10.96.0.12",
    }


@pytest.mark.parametrize("service", ["onnxpool", "onnxpool-demo-predictor"])
@pytest.mark.parametrize("cluster_ip", ["10.96.0.12", "fd00:10:96::12"])
def test_a_services_variables_are_no_settings(service: str, cluster_ip: str) -> None:
    links = kubelet_variables(service, cluster_ip)
    loaded = load_settings(environ=links)
    assert loaded.settings == load_settings(environ={}).settings
    assert set(loaded.sources.values()) <= {"default", f"file {loaded.config_file}"}
    assert loaded.service_links == tuple(sorted(links))
    line = loaded.service_links_line()
    assert line is not None and line.startswith(f"settings: ignored {', '.join(sorted(links))}: {IGNORED}")
    assert load_settings(environ={}).service_links_line() is None


def test_both_services_and_real_settings_together() -> None:
    env = {**platform_environment(), "ONNXPOOL_SERVER__BIND": "127.0.0.1:9000", "ONNXPOOL_SERVER__WORKERS": "1"}
    loaded = load_settings(environ=env)
    assert (loaded.settings.server.bind, loaded.settings.server.workers) == ("127.0.0.1:9000", 1)
    assert loaded.sources["server.bind"] == "env ONNXPOOL_SERVER__BIND"
    links = sorted(name for name in env if name.startswith("ONNXPOOL_") and "__" not in name)
    assert loaded.service_links == tuple(links) and len(links) == 26


def test_docker_link_variables_are_no_settings() -> None:
    """`docker run --link onnxpool:onnxpool`: the port variables, the link's name, the linked container's env."""
    env = {
        "ONNXPOOL_NAME": "/front/onnxpool",
        "ONNXPOOL_PORT": "tcp://172.17.0.2:8000",
        "ONNXPOOL_PORT_8000_TCP": "tcp://172.17.0.2:8000",
        "ONNXPOOL_PORT_8000_TCP_ADDR": "172.17.0.2",
        "ONNXPOOL_PORT_8000_TCP_PORT": "8000",
        "ONNXPOOL_PORT_8000_TCP_PROTO": "tcp",
        "ONNXPOOL_ENV_ONNXPOOL_SERVER__BIND": "unix:/run/onnxpool/onnxpool.sock",
        "ONNXPOOL_ENV_PATH": "/usr/local/bin:/usr/bin",
    }
    loaded = load_settings(environ=env)
    assert loaded.service_links == tuple(sorted(env))
    assert loaded.settings.server.bind == load_settings(environ={}).settings.server.bind


@pytest.mark.parametrize(
    ("var", "value", "expected"),
    [
        ("ONNXPOOL_PORT", "tcp://10.96.0.12:8000", True),
        ("ONNXPOOL_PORT", "udp://10.96.0.12:53", True),
        ("ONNXPOOL_PORT", "sctp://[fd00::12]:9000", True),
        ("ONNXPOOL_PORT", "8000", False),  # a port alone is what someone types, never what the kubelet writes
        ("ONNXPOOL_PORT", "http://10.96.0.12:8000", False),
        ("ONNXPOOL_PORT", "tcp://onnxpool:8000", False),
        ("ONNXPOOL_PORT", "tcp://10.96.0.12:80000", False),
        ("ONNXPOOL_PORT", "tcp://[10.96.0.12]:8000", False),
        ("ONNXPOOL_SERVICE_HOST", "10.96.0.12", True),
        ("ONNXPOOL_SERVICE_HOST", "onnxpool.default.svc", False),
        ("ONNXPOOL_SERVICE_PORT", "8000", True),
        ("ONNXPOOL_SERVICE_PORT", "08000", False),
        ("ONNXPOOL_SERVICE_PORT_METRICS_HTTP", "9090", True),
        ("ONNXPOOL_SERVICE_PORT_HTTP", "http", False),
        ("ONNXPOOL_PORT_8000_TCP", "tcp://10.96.0.12:8000", True),
        ("ONNXPOOL_PORT_8000_TCP", "tcp://10.96.0.12:8001", False),
        ("ONNXPOOL_PORT_8000_TCP", "udp://10.96.0.12:8000", False),
        ("ONNXPOOL_PORT_8000_TCP_PROTO", "tcp", True),
        ("ONNXPOOL_PORT_8000_TCP_PROTO", "udp", False),
        ("ONNXPOOL_PORT_8000_TCP_PORT", "8000", True),
        ("ONNXPOOL_PORT_8000_TCP_PORT", "8001", False),
        ("ONNXPOOL_PORT_8000_TCP_ADDR", "10.96.0.12", True),
        ("ONNXPOOL_PORT_8000_HTTP_ADDR", "10.96.0.12", False),
        ("ONNXPOOL_DEMO_PREDICTOR_PORT_8001_TCP", "tcp://10.96.0.13:8001", True),
        ("ONNXPOOL_SERVER__PORT", "tcp://10.96.0.12:8000", False),  # no Service's name ends in `-`
        ("ONNXPOOL_NAME", "/front/onnxpool", True),
        ("ONNXPOOL_NAME", "my-model", False),
        ("ONNXPOOL_ENV_WORKERS", "2", False),  # docker's only beside its link's ONNXPOOL_NAME
    ],
)
def test_recognised_by_name_and_value(var: str, value: str, expected: bool) -> None:
    assert is_service_link(var, value, {var: value}) is expected


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("ONNXPOOL_SERVER__BINDD", "127.0.0.1:9000"),
        ("ONNXPOOL_PORT", "8000"),
        ("ONNXPOOL_SERVICE_HOST", "onnxpool.default.svc"),
        ("ONNXPOOL_PORT_8000_TCP", "tcp://10.96.0.12:8001"),
        ("ONNXPOOL_ENV_WORKERS", "2"),
    ],
)
def test_typos_are_still_refused_with_the_same_message(var: str, value: str) -> None:
    """Among the service links too, and with the message the variable alone gets (as before)."""
    alone = refusal({var: value})
    assert alone.startswith(f"{UNKNOWN} {var}; allowed: ONNXPOOL_")
    assert refusal({**platform_environment(), var: value}) == alone
    if var == "ONNXPOOL_SERVER__BINDD":
        assert "ONNXPOOL_SERVER__BIND," in alone


def test_onnxpool_config_names_them(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in kubelet_variables("onnxpool", "10.96.0.12").items():
        monkeypatch.setenv(name, value)
    assert onnxpool_main(["config"]) == 0
    comments = [line for line in capsys.readouterr().out.splitlines() if line.startswith("#")]
    assert len(comments) == 2 and comments[1].startswith("# settings: ignored ONNXPOOL_PORT, ")
    assert IGNORED in comments[1]


def serve_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "onnxpool.cli", "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"]


def test_serve_starts_among_service_links(tmp_path: Path) -> None:
    """`onnxpool serve` in a pod beside Services named onnxpool and onnxpool-demo-predictor: it serves."""
    port = free_port()
    server = start_command(serve_argv(port), tmp_path, port, "/v2/health/ready", env=platform_environment())
    try:
        assert requests.get(f"{server.url}/v2/health/ready", timeout=5).status_code == 200
        lines = [line for line in server.log().splitlines() if IGNORED in line]
        assert len(lines) == 1, server.log()
        assert "ONNXPOOL_PORT, " in lines[0] and "ONNXPOOL_DEMO_PREDICTOR_SERVICE_HOST" in lines[0]
        assert "KUBERNETES_" not in lines[0] and " INFO " in lines[0]
    finally:
        server.stop()


def test_serve_still_refuses_a_misspelt_setting_among_them(tmp_path: Path) -> None:
    port = free_port()
    env = {**platform_environment(), "ONNXPOOL_SERVER__BINDD": f"127.0.0.1:{port}"}
    log_path = tmp_path / "serve.log"
    server = Server(process=spawn_logged(serve_argv(port), log_path, clean_env(env)), port=port, log_path=log_path)
    try:
        assert server.process.wait(timeout=60) == 1
    finally:
        server.stop()
    lines = [line for line in server.log().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"onnxpool: error: {UNKNOWN} ONNXPOOL_SERVER__BINDD; allowed: ONNXPOOL_SERVER__")
