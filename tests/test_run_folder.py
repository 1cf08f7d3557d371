"""The master's run folder: one writable place, stale folders of killed masters removed, copies managed."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from onnxpool.config.settings import MetricsSettings
from onnxpool.workers.run_folder import METRICS_ENV, RunFolder, default_base, filesystem_type, remove_stale


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


def test_a_folder_is_stale_when_no_process_holds_its_lock(tmp_path: Path) -> None:
    """As in a shared emptyDir: every container's master is pid 1, so the lock decides, not the pid
    (a folder named after this live process, its run gone, is removed; one held by a child is kept)."""
    made = "from onnxpool.workers.run_folder import RunFolder; import sys; print(RunFolder.create(sys.argv[1]).path)"
    gone = Path(subprocess.run([sys.executable, "-c", made, str(tmp_path)], capture_output=True, text=True,
                               check=True).stdout.strip())  # fmt: skip
    same_pid = gone.rename(tmp_path / f"onnxpool-{os.getpid()}-gone")
    holder = subprocess.Popen(
        [sys.executable, "-c", made + "; sys.stdout.flush(); sys.stdin.read()", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        held = Path(holder.stdout.readline().strip())
        remove_stale(tmp_path)
        assert not same_pid.exists() and held.is_dir()
    finally:
        holder.communicate("")
    remove_stale(tmp_path)
    assert not held.exists()


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
    first = run.served_form(run.copy_model(model))
    assert first.name == "model.onnx" and first.parent.parent == run.path / "models"
    run.promote_model(first)
    second = run.served_form(run.copy_model(model))
    run.promote_model(second)
    assert not first.parent.exists() and run.current_model == second  # running workers mapped the old copy
    rejected = run.copy_model(model)
    assert rejected.read_bytes() == b"first" and rejected.parent != second.parent
    run.discard_model(rejected)
    assert not rejected.parent.exists() and second.parent.exists()
    assert model.read_bytes() == b"first"
    run.remove()
    assert not run.path.exists()


def _mounts(*lines: tuple[str, str]) -> str:
    return "".join(f"dev {point} {kind} rw 0 0\n" for point, kind in lines)


def test_filesystem_type_is_the_longest_mount_point_holding_the_path(tmp_path: Path) -> None:
    mounts = _mounts(("/", "ext4"), (str(tmp_path), "tmpfs"), (str(tmp_path / "disk"), "xfs"))
    (tmp_path / "disk" / "deep").mkdir(parents=True)
    assert filesystem_type(tmp_path / "a", mounts) == "tmpfs"
    assert filesystem_type(tmp_path / "disk" / "deep", mounts) == "xfs"
    assert filesystem_type(Path("/definitely/elsewhere"), mounts) == "ext4"
    assert filesystem_type(Path("/x"), "") is None


def test_default_run_folder_prefers_a_roomy_memory_filesystem(tmp_path: Path) -> None:
    runtime, shm = tmp_path / "runtime", tmp_path / "shm"
    runtime.mkdir()
    shm.mkdir()
    on_tmpfs = _mounts(("/", "ext4"), (str(runtime), "tmpfs"), (str(shm), "tmpfs"))
    on_disk = _mounts(("/", "ext4"))
    system_tmp = Path(tempfile.gettempdir())
    # $XDG_RUNTIME_DIR first when it is a memory file system (tmp_path has far more than 1 GiB free here)
    assert default_base({"XDG_RUNTIME_DIR": str(runtime)}, on_tmpfs) == runtime
    # a disk-backed one is passed over, and so is a missing one
    assert default_base({"XDG_RUNTIME_DIR": str(runtime)}, on_disk) == system_tmp
    assert default_base({"XDG_RUNTIME_DIR": str(tmp_path / "gone")}, on_disk) == system_tmp
    # an explicit $TMPDIR is the operator's choice
    assert default_base({"TMPDIR": str(tmp_path), "XDG_RUNTIME_DIR": str(runtime)}, on_tmpfs) == system_tmp


def test_default_run_folder_skips_a_small_memory_filesystem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    runtime = tmp_path / "runtime"
    runtime.mkdir()
    small = shutil.disk_usage(runtime)._replace(free=64 << 20)  # Docker's default /dev/shm size
    monkeypatch.setattr(shutil, "disk_usage", lambda path: small)
    assert default_base({"XDG_RUNTIME_DIR": str(runtime)}, _mounts((str(runtime), "tmpfs"))) == Path(
        tempfile.gettempdir()
    )
