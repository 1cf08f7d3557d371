"""Shared fixtures: a clean onnxpool environment for every test, and one real server per module."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Server, free_port, start_server
from tests.redis_harness import RedisServer


@pytest.fixture(autouse=True)
def _clean_onnxpool_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ONNXPOOL_* variable from the caller's shell leaks into a test."""
    for key in list(os.environ):
        if key.startswith("ONNXPOOL_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real gunicorn onnxpool (2 workers, demo model) shared by a test module."""
    tmp: Path = tmp_path_factory.mktemp("server")
    srv = start_server(tmp, {"ONNXPOOL_SERVER__WORKERS": "2"}, workers=2)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (Debian package redis-server)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    srv = RedisServer(free_port(), tmp_path / "redis.log")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
