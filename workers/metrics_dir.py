"""The master's per-run folder for prometheus_client's multiprocess files.

Process rules (why this lives on the master side, at config load):
- prometheus_client decides at IMPORT time whether it runs in multiprocess
  mode, by reading $PROMETHEUS_MULTIPROC_DIR. The master must therefore export
  it before anything imports prometheus_client (the preloaded app does), and
  every forked worker inherits it.
- Each process writes its own `<kind>_<pid>.db` files there; GET /metrics in
  any worker sums all of them. Files of a previous run would be summed too, so
  the folder is fresh (or emptied) when the master starts and is never reused
  across runs; a HUP reload keeps it, so totals survive worker replacement.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from config.settings import MetricsSettings
from workers.rundirs import run_folder

ENV_VAR = "PROMETHEUS_MULTIPROC_DIR"

log = logging.getLogger("onnxpool.workers")


@dataclass(frozen=True)
class MetricsDir:
    """The folder in use and whether this run created it (and so removes it at exit)."""

    path: Path
    owned: bool


def prepare(settings: MetricsSettings) -> MetricsDir | None:
    """Create or empty the folder and export it; None (and nothing exported) when metrics are off."""
    if "prometheus_client" in sys.modules:
        # Too late: it already chose its storage; metrics would silently stay per process.
        raise RuntimeError("prometheus_client was imported before the metrics folder was set up")
    if not settings.enabled:
        os.environ.pop(ENV_VAR, None)  # an inherited folder must not collect our files
        return None
    if settings.dir:
        path = Path(settings.dir)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
        folder = MetricsDir(path, owned=False)
    else:
        folder = MetricsDir(run_folder("metrics"), owned=True)
    os.environ[ENV_VAR] = str(folder.path)
    return folder


def remove(folder: MetricsDir | None) -> None:
    """At master exit: delete a folder this run created (a configured one is left, emptied next start)."""
    if folder is not None and folder.owned:
        shutil.rmtree(folder.path, ignore_errors=True)
