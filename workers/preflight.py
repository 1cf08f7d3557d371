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


def _label_count(settings: Settings) -> int | None:
    path = settings.model.labels
    if path is None:
        return None
    try:
        with path.open(encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())
    except FileNotFoundError:
        raise ModelError(f"labels file {path} does not exist") from None
    except UnicodeDecodeError:
        raise ModelError(f"labels file {path} is not UTF-8 text") from None
    except OSError as exc:
        raise ModelError(f"labels file {path} cannot be read: {exc.strerror}") from None


def preflight(settings: Settings, model_file: Path | None = None) -> ModelInfo:
    """Load the model (or `model_file`, a copy of it) in a subprocess and check the settings that refer to it."""
    model = settings.model
    info = probe_model(model_file or model.path)
    if model.input_name and info.input(model.input_name) is None:
        known = ", ".join(t.name for t in info.inputs)
        raise ModelError(f"model.input_name = {model.input_name!r} is not an input of {model.path}; inputs: {known}")
    if model.output_name and info.output(model.output_name) is None:
        known = ", ".join(t.name for t in info.outputs)
        raise ModelError(
            f"model.output_name = {model.output_name!r} is not an output of {model.path}; outputs: {known}"
        )
    labels = _label_count(settings)
    output = info.output(model.output_name) if model.output_name else info.outputs[0]
    assert output is not None
    classes = output.shape[-1] if output.shape else -1
    if labels is not None and classes > 0 and labels != classes:
        raise ModelError(
            f"labels file {model.labels} has {labels} labels but output '{output.name}' has {classes} classes"
        )
    return info


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
