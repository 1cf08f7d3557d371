"""The wheel serves from anywhere: built, installed into a new venv outside the checkout, run elsewhere.

Installed beside a distribution with top-level `config` and `server` packages
(a Django project's `config/` is the common case), both must import: onnxpool
installs exactly one top-level import name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.harness import DATA, REPO, Server, free_port, spawn_logged

pytestmark = pytest.mark.slow


def run(argv: list[str], cwd: Path, timeout: float = 600) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def shadowing_distribution(folder: Path) -> Path:
    """A tiny local project that owns the top-level names `config` and `server`."""
    for name in ("config", "server"):
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f'OWNER = "app-{name}"\n')
    (folder / "pyproject.toml").write_text(
        textwrap.dedent("""\
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "someapp"
            version = "1.0"

            [tool.setuptools]
            packages = ["config", "server"]
            """)
    )
    return folder


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new venv outside the checkout with the onnxpool wheel and the shadowing project; yields its bin/."""
    tmp = tmp_path_factory.mktemp("wheel")
    assert not tmp.resolve().is_relative_to(REPO)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp / "dist"), str(REPO)], tmp)
    (wheel,) = (tmp / "dist").glob("onnxpool-*.whl")
    run([sys.executable, "-m", "venv", str(tmp / "venv")], tmp)
    pip = [str(tmp / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    run([*pip, str(wheel), str(shadowing_distribution(tmp / "someapp"))], tmp)
    yield tmp / "venv" / "bin"


def test_one_top_level_import_name_and_no_shadowing(installed: Path, tmp_path: Path) -> None:
    script = textwrap.dedent("""\
        import importlib.metadata as md
        import config, server
        import onnxpool.config.loader, onnxpool.server.app
        assert config.OWNER == "app-config" and server.OWNER == "app-server"
        tops = {f.parts[0] for f in md.files("onnxpool") if not f.parts[0].endswith((".dist-info", ".data"))}
        tops = {t for t in tops if t not in ("..", "__pycache__")}
        print(sorted(tops))
        print((md.distribution("onnxpool").read_text("top_level.txt") or "").strip())
        """)
    out = run([str(installed / "python"), "-c", script], tmp_path).splitlines()
    assert out[0] == "['onnxpool']"
    assert out[1] in ("onnxpool", "")  # top_level.txt, when the wheel has one


def test_cli_commands_work_from_an_unrelated_directory(installed: Path, tmp_path: Path) -> None:
    config = run([str(installed / "onnxpool"), "config"], tmp_path)
    assert "model.path" in config and "efficientnet-lite0" in config and str(REPO) not in config
    site = run([str(installed / "onnxpool"), "nginx-config", "--upstream", "127.0.0.1:9001"], tmp_path)
    assert "server 127.0.0.1:9001" in site
    assert "--concurrency" in run([str(installed / "onnxpool"), "bench", "--help"], tmp_path)


def test_installed_server_labels_the_cat(installed: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONNXPOOL_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{installed}:{env.get('PATH', '')}"
    argv = [str(installed / "onnxpool"), "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    server = Server(process=spawn_logged(argv, tmp_path / "serve.log", env), port=port, log_path=tmp_path / "serve.log")
    try:
        server.wait_ready(1, timeout=120)
        with (DATA / "chelsea-cat.jpg").open("rb") as photo:
            reply = requests.post(server.url + "/predict", files={"image": photo}, timeout=30)
        assert reply.status_code == 200, reply.text
        top = reply.json()["predictions"][0][0]["label"]
        assert "cat" in top, reply.json()
        # The /docs page and Swagger UI's files are package data of the wheel and its dependency.
        for path in ("/docs", "/docs/onnxpool-docs.js", "/docs/swagger-ui-bundle.js"):
            assert requests.get(server.url + path, timeout=10).status_code == 200, path
        assert str(REPO) not in server.log()  # nothing was taken from the checkout
    finally:
        server.stop()
