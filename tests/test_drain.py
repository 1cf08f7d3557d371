"""launch/drain.py and launch/probe.py on their own (the pod test runs them in real processes)."""

from __future__ import annotations

import threading
from pathlib import Path

from onnxpool import drain, probe


class FakeArbiter:
    """Stands in for gunicorn's Arbiter: only the SIGTERM handler the hook wraps."""

    def __init__(self, pidfile: Path) -> None:
        self.pidfile = pidfile
        self.file_existed_at_term: bool | None = None

    def handle_term(self) -> None:
        self.file_existed_at_term = self.pidfile.exists()


def test_term_waits_until_the_pidfile_is_gone(tmp_path: Path) -> None:
    pidfile = tmp_path / "nginx.pid"
    pidfile.write_text("1\n")
    arbiter = FakeArbiter(pidfile)
    drain.hold_term_for_proxy(arbiter, pidfile, limit=30)
    remover = threading.Timer(0.3, pidfile.unlink)
    remover.start()
    arbiter.handle_term()
    remover.join()
    assert arbiter.file_existed_at_term is False  # gunicorn's own stop ran only after nginx was gone


def test_term_waits_no_longer_than_the_limit(tmp_path: Path) -> None:
    pidfile = tmp_path / "nginx.pid"
    pidfile.write_text("1\n")
    arbiter = FakeArbiter(pidfile)
    drain.hold_term_for_proxy(arbiter, pidfile, limit=0.2)
    arbiter.handle_term()
    assert arbiter.file_existed_at_term is True  # bounded: drained anyway


def test_wait_returns_at_once_without_the_file(tmp_path: Path) -> None:
    gone, waited = drain.wait_until_gone(tmp_path / "absent.pid", limit=10)
    assert gone and waited < 1


def test_probe_reports_an_unreachable_socket(tmp_path: Path) -> None:
    problem = probe.probe(f"unix:{tmp_path}/none.sock", "/v2/health/live", timeout=1)
    assert problem is not None and "none.sock" in problem
    assert probe.main([f"unix:{tmp_path}/none.sock", "/v2/health/live"]) == 1
    assert probe.main([]) == 2
