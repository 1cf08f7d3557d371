"""Step 7, output: the model and `OUT.quantize.json`, each through a temporary file and a rename.

Written only when a candidate met the budget, so nothing half-written is left.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from onnxpool.workers.cpu_fit import has_vnni


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


def cpu_description(flags: frozenset[str], usable_cores: int) -> dict[str, Any]:
    """The report's `cpu`: what decides which int8 kernels the speed and native numbers came from."""
    return {
        "machine": platform.machine(),
        "vnni": has_vnni(flags),
        "avx2": "avx2" in flags,
        "avx512": sorted(f for f in flags if f.startswith("avx512")),
        "flags": sorted(flags),
        "usable_cores": usable_cores,
    }


def write_outputs(output: Path, model: Path, report: dict[str, Any]) -> None:
    """The model and `OUT.quantize.json`, each atomically; no model is left without its report."""
    atomic_write(output, lambda p: p.write_bytes(model.read_bytes()))
    try:
        atomic_write(report_path(output), lambda p: p.write_text(json.dumps(report, indent=1) + "\n"))
    except BaseException:
        output.unlink(missing_ok=True)
        raise
