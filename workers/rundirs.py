"""Per-run temporary folders of the master, named after its pid, and their litter.

The master makes its folders (metrics files, validated model copies) with
`run_folder(kind)` and removes them when it exits. A master that was killed
with SIGKILL cannot: the next master removes folders whose owner pid is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def run_folder(kind: str) -> Path:
    """A fresh folder `onnxpool-<kind>-<master pid>-XXXX` in the temp dir; stale ones of dead masters go first."""
    remove_stale(kind)
    return Path(tempfile.mkdtemp(prefix=f"onnxpool-{kind}-{os.getpid()}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def remove_stale(kind: str, folder: Path | None = None) -> None:
    """Delete `onnxpool-<kind>-<pid>-*` folders whose master pid no longer exists."""
    base = folder or Path(tempfile.gettempdir())
    for path in base.glob(f"onnxpool-{kind}-*-*"):
        pid_text = path.name.split("-")[2]
        if pid_text.isdigit() and not _alive(int(pid_text)) and path.is_dir():
            with contextlib.suppress(OSError):
                shutil.rmtree(path)
