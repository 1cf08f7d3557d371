"""Step 7, output: the model and `OUT.quantize.json`, each through a temporary file and a rename.

Written only when a candidate met the budget, so nothing half-written is left.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path


def versions() -> dict[str, str]:
    out = {}
    for dist in ("onnxpool", "onnxruntime", "onnx", "numpy", "pillow"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        # mkstemp makes the file 0600; the result is an ordinary file (a server running as
        # another user reads it): the permissions a plain open() would have given it
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def report_path(output: Path) -> Path:
    return output.with_name(output.stem + ".quantize.json")
