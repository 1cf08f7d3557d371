"""Checks the master runs before forking: the model loads, settings and model agree, labels fit.

Everything here raises ModelError with one line an operator can act on.

The gunicorn master must fail fast on a missing or corrupt model, but must not
create an onnxruntime session itself (its thread pool would not survive the
fork into workers; docs/ARCHITECTURE.md). So it runs
`python -m onnxpool.workers.preflight PATH`, which loads the model with one
thread, prints the ModelInfo as JSON, and exits.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from onnxpool.config.settings import Settings
from onnxpool.workers.model_info import ModelInfo


class ModelError(ValueError):
    """The model file is missing, unreadable or not a valid ONNX model (one-line message)."""


def _first_line(text: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "unknown error")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def probe_model(path: Path, timeout: float = 300.0) -> ModelInfo:
    """Load `path` in a subprocess; return its ModelInfo or raise ModelError."""
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "onnxpool.workers.preflight", str(path)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ModelError(f"model file {path} did not load within {timeout:.0f}s") from None
    if done.returncode != 0:
        raise ModelError(f"model file {path} cannot be loaded: {_first_line(done.stderr)}")
    info = ModelInfo.from_dict(json.loads(done.stdout))
    if not info.inputs or not info.outputs:
        raise ModelError(f"model file {path} has no inputs or no outputs")
    return info


def main(argv: list[str]) -> int:
    from onnxpool.workers.session import build_session, model_info_of  # onnxruntime only in the child

    try:
        session = build_session(Path(argv[0]), intra_op_threads=1, optimization="disable")
    except Exception as exc:  # onnxruntime raises several unrelated types for bad files
        print(_first_line(str(exc)), file=sys.stderr)
        return 1
    print(json.dumps(model_info_of(session).to_dict()))
    return 0


def preflight(settings: Settings, model_file: Path | None = None) -> ModelInfo:
    """Load the model (or `model_file`, a copy of it) in a subprocess: its inputs and outputs.

    What the task needs of them (an image input, labels that fit the classes...) is the task's
    to check, when the master binds it to the model (`onnxpool.tasks.registry.build_task`)."""
    return probe_model(model_file or settings.model.path)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
