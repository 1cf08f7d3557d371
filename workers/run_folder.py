"""The master's per-run folder: every file the server writes while it runs lives in it.

    <server.run_dir, else default_base()>/onnxpool-<master pid>-XXXX/
        metrics/     prometheus_client's per-process files (unless [metrics] dir names a folder)
        models/      one folder per validated model: the form new workers load (NNNN/<name> and
                     NNNN/<name>.data, the weights every worker maps)
        heartbeat/   gunicorn's worker heartbeat files (`worker_tmp_dir`)
        cache/       the local response cache (LMDB), shared by the workers ([cache])

So one writable folder (a tmpfs, a Kubernetes emptyDir) is all a read-only
root filesystem needs. Without a configured `run_dir` the folder goes on a
memory-backed file system when there is a roomy one (`default_base`): the
response cache and the metrics write to it on every request. The master makes the folder at its first config load,
keeps it across HUP reloads, and removes it when it exits; a master killed with
SIGKILL cannot, so each new master first removes the stale folders: those whose
lock file no process holds. Process rules (docs/ARCHITECTURE.md):

- Staleness is a lock, not a pid: the master takes an exclusive flock on the
  folder's `.lock` and every forked worker inherits the open file, so the lock
  lasts while any process of the run lives (a killed master's orphaned workers
  too). A pid would not do where several containers share one emptyDir: each
  container's master is pid 1 in its own namespace, and a restarted one is pid 1
  again, so its dead predecessor's folder would look alive forever.

- Metrics: prometheus_client decides at IMPORT time whether it runs in
  multiprocess mode, by reading $PROMETHEUS_MULTIPROC_DIR. The master exports it
  here, before anything imports prometheus_client, and every forked worker
  inherits it. Each process writes its own `<kind>_<pid>.db` files; GET /metrics
  in any worker sums all of them, so the folder is fresh (or emptied) per run,
  never shared across runs, and kept across HUP so totals survive.
- Model copies: workers build their session from the copy the master
  validated, never from the configured path, so a broken or half-written file
  swapped in before a HUP is refused and new workers keep the last good copy.
  The master copies the file's bytes (`copy_model`: what the response cache's
  digest is taken of); the preflight subprocess writes from them the form
  workers load (`served_form`: onnxruntime's optimised graph, its weights in a
  data file that every worker maps, so a host holds them once) and the byte copy
  goes. A model with external data files of its own (tensors in `*.data` next
  to the .onnx) does not load from a lone byte copy; its served form is then
  written from its configured path. The configured file is only ever read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from onnxpool.config.settings import MetricsSettings

METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"
PREFIX = "onnxpool-"
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
# Room the default folder must have on a memory file system: the response cache (64 MiB by
# default, plus its write-ahead log), the model copies and the metrics files, with margin.
# Docker's default /dev/shm (64 MiB) is too small and is passed over.
MIN_FREE_BYTES = 1 << 30


def filesystem_type(path: Path, mounts: str | None = None) -> str | None:
    """The type of the file system `path` lives on, from /proc/self/mounts (longest mount point wins)."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    target = os.path.realpath(path)
    best, kind = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def default_base(environ: Mapping[str, str] | None = None, mounts: str | None = None) -> Path:
    """Where run folders go when `[server] run_dir` is "".

    An explicit $TMPDIR wins. Otherwise the first of $XDG_RUNTIME_DIR and /dev/shm that is
    a writable memory file system with MIN_FREE_BYTES free, else the system temp dir.
    Why: every cache miss writes the LMDB store and every request the metrics files;
    on a disk-backed /tmp the kernel's write-back of those pages cost 2.5 % of /predict
    throughput with no repeats (docs/BENCHMARKS.md), on a tmpfs nothing is written back.
    """
    env = os.environ if environ is None else environ
    if env.get("TMPDIR"):
        return Path(tempfile.gettempdir())
    for candidate in (env.get("XDG_RUNTIME_DIR"), "/dev/shm"):
        if not candidate:
            continue
        path = Path(candidate)
        try:
            roomy = shutil.disk_usage(path).free >= MIN_FREE_BYTES
        except OSError:
            continue
        if roomy and os.access(path, os.W_OK | os.X_OK) and filesystem_type(path, mounts) in MEMORY_FILESYSTEMS:
            return path
    return Path(tempfile.gettempdir())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


LOCK_FILE = ".lock"


def _hold_lock(folder: Path) -> int:
    """An exclusive flock on `folder`'s lock file, held by this process and every child it forks
    (the file stays open, inheritable, for the process's life)."""
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _stale(path: Path) -> bool:
    """No process of its run is left: nobody holds its lock (a folder without one: its master's pid is gone)."""
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        pid_text = path.name[len(PREFIX) :].split("-")[0]
        return pid_text.isdigit() and not _alive(int(pid_text))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: a process of that run lives
    finally:
        os.close(fd)
    return True


def remove_stale(base: Path) -> None:
    """Delete the `onnxpool-<pid>-*` folders in `base` that no live process holds."""
    for path in base.glob(f"{PREFIX}*-*"):
        if path.is_dir() and _stale(path):
            with contextlib.suppress(OSError):
                shutil.rmtree(path)


@dataclass
class RunFolder:
    """This run's folder and what lives in it: model copies, metrics folder, heartbeat folder."""

    path: Path
    metrics: Path | None = None
    """The folder exported as $PROMETHEUS_MULTIPROC_DIR (None: metrics are off)."""
    current_model: Path | None = None
    """The validated model copy new workers load."""
    _copies: int = field(default=0, repr=False)

    @classmethod
    def create(cls, base: str = "") -> RunFolder:
        """A fresh folder under `base` ("" = `default_base()`); stale ones of dead masters go first."""
        parent = Path(base) if base else default_base()
        parent.mkdir(parents=True, exist_ok=True)
        remove_stale(parent)
        path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent))
        _hold_lock(path)
        for sub in ("models", "heartbeat"):
            (path / sub).mkdir()
        return cls(path)

    @property
    def heartbeat(self) -> Path:
        """gunicorn's `worker_tmp_dir`."""
        return self.path / "heartbeat"

    # --- metrics -----------------------------------------------------------

    def export_metrics(self, settings: MetricsSettings) -> Path | None:
        """Create (or empty) the metrics folder and export it; None, and nothing exported, when off."""
        if "prometheus_client" in sys.modules:
            # Too late: it already chose its storage; metrics would silently stay per process.
            raise RuntimeError("prometheus_client was imported before the metrics folder was set up")
        if not settings.enabled:
            os.environ.pop(METRICS_ENV, None)  # an inherited folder must not collect our files
            return None
        folder = Path(settings.dir) if settings.dir else self.path / "metrics"
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.db"):
            stale.unlink()
        os.environ[METRICS_ENV] = str(folder)
        self.metrics = folder
        return folder

    # --- validated model copies -------------------------------------------

    def copy_model(self, source: Path) -> Path:
        """Copy `source`'s bytes into a fresh models/NNNN/ folder (not yet current); OSError if unreadable."""
        self._copies += 1
        folder = self.path / "models" / f"{self._copies:04d}"
        folder.mkdir()
        target = folder / f"{source.name}.bytes"
        shutil.copyfile(source, target)
        return target

    @staticmethod
    def served_form(copy: Path) -> Path:
        """Where the preflight writes the form workers load, beside the byte copy `copy`."""
        return copy.with_name(copy.name.removesuffix(".bytes"))

    def promote_model(self, served: Path) -> None:
        """Make `served` what new workers load; drop the previous copy's folder.

        Running workers have mapped its data file already: unlinked, its pages live on until
        the last of them exits.
        """
        previous, self.current_model = self.current_model, served
        if previous is not None and previous.parent != served.parent:
            self.discard_model(previous)

    def discard_model(self, copy: Path) -> None:
        """Forget a copy (its whole folder) that failed validation or was replaced."""
        if self.owns(copy):
            shutil.rmtree(copy.parent, ignore_errors=True)

    def owns(self, path: Path) -> bool:
        return path.parent.parent == self.path / "models"

    @property
    def cache(self) -> Path:
        """The local response cache's folder (created by the master, opened by each worker)."""
        return self.path / "cache"

    def remove(self) -> None:
        """Delete the folder (master exit). A configured [metrics] dir is left, emptied next start."""
        shutil.rmtree(self.path, ignore_errors=True)
