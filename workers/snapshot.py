"""Private, validated copies of the model file, so a bad file never reaches a worker.

Workers build their session from the file the master validated, not from the
configured path: the master copies the model into a folder of its own, checks
the COPY, and only then points new workers at it. So swapping `model.path`
and sending HUP is safe either way: a good new file is served by the new
workers, a broken or half-written one is refused (logged) and the new workers
keep loading the last good copy instead of failing to boot, which would make
gunicorn halt the whole server.

A model with external data files (tensors in `*.data` next to the .onnx) does
not load from a lone copy; it is then served from its configured path, without
this protection, and a log line says so.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from workers.rundirs import run_folder


@dataclass
class ModelSnapshots:
    """The master's copies: `current` is what new workers load."""

    folder: Path = field(default_factory=lambda: run_folder("model"))
    current: Path | None = None
    _taken: int = 0

    def take(self, source: Path) -> Path:
        """Copy `source` into the folder (not yet current); raises OSError if unreadable."""
        self._taken += 1
        target = self.folder / f"{self._taken:04d}-{source.name}"
        shutil.copyfile(source, target)
        return target

    def promote(self, path: Path) -> None:
        """Make `path` what new workers load; drop the previous copy (running workers loaded it already)."""
        previous, self.current = self.current, path
        if previous is not None and previous != path and previous.parent == self.folder:
            previous.unlink(missing_ok=True)

    def discard(self, path: Path) -> None:
        """Forget a copy that failed validation."""
        if path.parent == self.folder:
            path.unlink(missing_ok=True)

    def remove(self) -> None:
        """Delete the folder (master exit)."""
        shutil.rmtree(self.folder, ignore_errors=True)
