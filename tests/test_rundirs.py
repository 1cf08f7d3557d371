"""Folders of masters killed with SIGKILL are removed by the next master; live ones are kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from workers.rundirs import remove_stale


def test_stale_folders_of_dead_masters_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f"onnxpool-model-{dead_pid}-abc"
    live = tmp_path / f"onnxpool-model-{os.getpid()}-def"
    other_kind = tmp_path / f"onnxpool-metrics-{dead_pid}-ghi"
    for folder in (stale, live, other_kind):
        folder.mkdir()
        (folder / "file").write_text("x")
    remove_stale("model", tmp_path)
    assert not stale.exists()
    assert live.exists() and other_kind.exists()
