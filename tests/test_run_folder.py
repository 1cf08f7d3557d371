"""The master's run folder: one writable place, stale folders of killed masters removed, copies managed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from onnxpool.config.settings import MetricsSettings
from onnxpool.workers.run_folder import METRICS_ENV, RunFolder, remove_stale


def test_stale_folders_of_dead_masters_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f"onnxpool-{dead_pid}-abc"
    live = tmp_path / f"onnxpool-{os.getpid()}-def"
    unrelated = tmp_path / "onnxpool-cache"
    for folder in (stale, live, unrelated):
        folder.mkdir()
        (folder / "file").write_text("x")
    remove_stale(tmp_path)
    assert not stale.exists()
    assert live.exists() and unrelated.exists()


def test_everything_lives_under_the_configured_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(METRICS_ENV, "")  # so that monkeypatch restores the variable export_metrics sets
    monkeypatch.delenv(METRICS_ENV)
    monkeypatch.delitem(sys.modules, "prometheus_client", raising=False)  # as in a fresh master
    run = RunFolder.create(str(tmp_path / "run"))
    assert run.path.parent == tmp_path / "run"
    assert run.path.name.startswith(f"onnxpool-{os.getpid()}-")
    metrics = run.export_metrics(MetricsSettings())
    assert metrics == run.path / "metrics" and os.environ[METRICS_ENV] == str(metrics)
    assert run.heartbeat.is_dir() and run.heartbeat.parent == run.path
    model = tmp_path / "model.onnx"
    model.write_bytes(b"first")
    first = run.copy_model(model)
    run.promote_model(first)
    second = run.copy_model(model)
    run.promote_model(second)
    assert not first.exists() and run.current_model == second  # running workers loaded the old copy already
    rejected = run.copy_model(model)
    run.discard_model(rejected)
    assert not rejected.exists()
    run.remove()
    assert not run.path.exists()
