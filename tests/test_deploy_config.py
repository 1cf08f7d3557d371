"""The deployment files: nginx site rendering, `onnxpool nginx-config`, the systemd unit."""

from __future__ import annotations

import shutil
import subprocess
import sys
from hashlib import sha256
from pathlib import Path

import pytest

from onnxpool.cli import main
from onnxpool.config.loader import ConfigError, load_settings
from onnxpool.config.nginx import RENDERED_DEFAULT, render_site
from onnxpool.config.settings import AuthSettings, CallerSettings, NginxSettings, ServerSettings, Settings
from tests.deploy_harness import nginx_binary
from tests.harness import REPO, clean_env

UNIT = REPO / "config" / "systemd" / "onnxpool.service"


def test_rendered_default_is_in_sync_with_template() -> None:
    assert RENDERED_DEFAULT.read_text() == render_site(Settings()), "run: onnxpool nginx-config -o " + str(
        RENDERED_DEFAULT
    )


def test_site_follows_settings() -> None:
    settings = Settings(
        server=ServerSettings(timeout=45, max_body_bytes=2_000_000),
        nginx=NginxSettings(
            listen="127.0.0.1:8080",
            upstreams=("10.0.0.11:8000", "unix:/run/onnxpool/onnxpool.sock"),
            next_upstream_tries=2,
            max_fails=5,
            fail_timeout=7,
            keepalive=0,
            access_log="",
        ),
    )
    site = render_site(settings)
    assert "listen 127.0.0.1:8080;" in site
    assert "server 10.0.0.11:8000 max_fails=5 fail_timeout=7s;" in site
    assert "server unix:/run/onnxpool/onnxpool.sock max_fails=5 fail_timeout=7s;" in site
    assert "client_max_body_size 2000000;" in site
    assert "proxy_read_timeout 45s;" in site
    assert "proxy_next_upstream error timeout http_502 http_503 non_idempotent;" in site
    assert "proxy_next_upstream_tries 2;" in site
    assert 'proxy_set_header X-Request-Start "t=${msec}";' in site
    assert "access_log off;" in site
    assert "\n    keepalive " not in site
    assert "%{" not in site.split("\n\n", 1)[1]  # past the header comment that names the syntax


def test_upstream_defaults_to_server_bind() -> None:
    site = render_site(Settings(server=ServerSettings(bind="unix:/run/x/onnxpool.sock")))
    assert "server unix:/run/x/onnxpool.sock max_fails=3 fail_timeout=10s;" in site


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("nginx.upstreams", ["10.0.0.1"]),
        ("nginx.upstreams", ["a:80; evil"]),
        ("nginx.listen", "80 ssl"),
        ("nginx.server_name", ""),
    ],
)
def test_bad_nginx_values_are_refused(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key):
        load_settings(environ={}, overrides={key: value})


def test_nginx_config_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "site.conf"
    assert (
        main(
            [
                "nginx-config",
                "--listen",
                "8081",
                "--upstream",
                "10.0.0.1:8000",
                "--upstream",
                "10.0.0.2:8000",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    site = out.read_text()
    assert "listen 8081;" in site and "server 10.0.0.2:8000 " in site
    assert main(["nginx-config", "--upstream", "nowhere"]) == 1
    assert "nginx.upstreams" in capsys.readouterr().err


@pytest.mark.nginx
@pytest.mark.skipif(nginx_binary() is None, reason="nginx binary not installed (apt-get install nginx-light)")
def test_rendered_site_passes_nginx_t(tmp_path: Path) -> None:
    site = tmp_path / "site.conf"
    text = render_site(Settings(nginx=NginxSettings(access_log=str(tmp_path / "access.log"), listen="127.0.0.1:1")))
    site.write_text(text)
    main_conf = tmp_path / "nginx.conf"
    main_conf.write_text(f"pid {tmp_path}/nginx.pid;\nevents {{}}\nhttp {{ include {site}; }}\n")
    binary = nginx_binary()
    assert binary is not None
    result = subprocess.run(
        [binary, "-t", "-p", str(tmp_path), "-c", str(main_conf), "-e", str(tmp_path / "error.log")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_systemd_unit_essentials() -> None:
    lines = {
        line.split("=", 1)[0]: line.split("=", 1)[1]
        for line in UNIT.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    }
    assert lines["User"] == "onnxpool"
    assert lines["ExecStart"].endswith("/.venv/bin/onnxpool serve")
    assert lines["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert lines["KillSignal"] == "SIGTERM"
    assert lines["RuntimeDirectory"] == "onnxpool"
    assert int(lines["TimeoutStopSec"]) > ServerSettings().graceful_timeout
    assert lines["NoNewPrivileges"] == "yes"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not available")
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    """`systemd-analyze verify`, with the paths pointed at this checkout (they must exist)."""
    unit = tmp_path / "onnxpool.service"
    text = UNIT.read_text().replace("/opt/onnxpool/.venv/bin/onnxpool", str(Path(sys.executable).parent / "onnxpool"))
    unit.write_text(text.replace("WorkingDirectory=/opt/onnxpool", f"WorkingDirectory={REPO}"))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_client_timeouts_follow_settings() -> None:
    site = render_site(Settings(nginx=NginxSettings(client_timeout=7)))
    for directive in ("client_header_timeout", "client_body_timeout", "send_timeout"):
        assert f"{directive} 7s;" in site
    assert "location = /nginx/live {" in site


def test_nginx_command_needs_a_pidfile(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONNXPOOL_CONFIG", raising=False)
    monkeypatch.delenv("ONNXPOOL_NGINX__PIDFILE", raising=False)
    assert main(["nginx"]) == 1
    assert "[nginx] pidfile" in capsys.readouterr().err


def test_relative_nginx_pidfile_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"nginx\.pidfile"):
        load_settings(environ={}, overrides={"nginx.pidfile": "run/nginx.pid"})


@pytest.mark.nginx
@pytest.mark.skipif(nginx_binary() is None, reason="nginx binary not installed (apt-get install nginx-light)")
@pytest.mark.parametrize("callers", ["none", "by key, with quotas"])
def test_pod_nginx_configuration_passes_nginx_t(tmp_path: Path, callers: str) -> None:
    """What `onnxpool nginx` writes (main configuration + the VM site) is one nginx accepts; with callers
    named by key too (its js module loaded, callers.js beside the site holding digests, never a key)."""
    from onnxpool import proxy

    key = "sk-a-key-of-some-length"
    settings = Settings(
        server=ServerSettings(bind=f"unix:{tmp_path}/onnxpool.sock", graceful_timeout=12),
        nginx=NginxSettings(listen="127.0.0.1:1", access_log="/dev/stdout", pidfile=str(tmp_path / "n" / "nginx.pid")),
    )
    if callers != "none":
        quota = CallerSettings(rate=2.5, burst=3, concurrency=2)
        caller = {"key-" + sha256(key.encode()).hexdigest()[:8]: quota}
        settings = settings.model_copy(update={"auth": AuthSettings(api_keys=(key,)), "caller": caller})
    binary = nginx_binary()
    assert binary is not None
    main_conf = proxy.write_config(settings, binary)
    text = main_conf.read_text()
    assert f"pid {tmp_path}/n/nginx.pid;" in text and "worker_shutdown_timeout 12s;" in text
    assert f"include {tmp_path}/n/{proxy.SITE_FILE};" in text
    assert (tmp_path / "n" / "tmp" / "body").is_dir()
    site = (tmp_path / "n" / proxy.SITE_FILE).read_text()
    if callers == "none":
        assert "lane" not in site and not (tmp_path / "n" / "callers.js").exists()
    else:
        assert "ngx_http_js_module.so" in text and "rate=150r/m" in site and "limit_conn" in site
        script = (tmp_path / "n" / "callers.js").read_text()
        assert sha256(key.encode()).hexdigest() in script and key not in script + site
    result = subprocess.run(
        [binary, "-t", "-p", str(main_conf.parent), "-c", str(main_conf), "-e", "stderr"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_listen_may_be_a_port_alone_from_the_environment() -> None:
    loaded = load_settings(environ={"ONNXPOOL_NGINX__LISTEN": "8000"})
    assert loaded.settings.nginx.listen == "8000"


@pytest.mark.nginx
@pytest.mark.skipif(nginx_binary() is None, reason="nginx binary not installed (apt-get install nginx-light)")
def test_no_reachable_instance_is_a_json_503_with_retry_after(tmp_path: Path) -> None:
    """nginx's own error when no onnxpool answers (e.g. the pod's gunicorn still starting): 503, not 502."""
    import requests

    from tests.deploy_harness import start_nginx

    nginx = start_nginx(tmp_path, [f"unix:{tmp_path}/absent.sock"])
    try:
        reply = requests.get(nginx.url + "/v2/health/ready", timeout=10)
    finally:
        nginx.stop()
    assert reply.status_code == 503, reply.text
    assert reply.headers.get("Retry-After") == "1"
    assert reply.json() == {"error": "no onnxpool instance is available; retry shortly"}
