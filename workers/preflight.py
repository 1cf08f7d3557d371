"""Checks the master runs before forking: settings and model agree, labels fit.

Everything here raises ModelError with one line an operator can act on.
"""

from __future__ import annotations

from pathlib import Path

from config.settings import Settings
from workers.model_info import ModelInfo
from workers.model_probe import ModelError, probe_model


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
