"""Checks the master runs before forking: the model loads, settings and model agree, labels fit.

Everything here raises ModelError with one line an operator can act on.

The gunicorn master must fail fast on a missing or corrupt model, but must not
create an onnxruntime session itself (its thread pool would not survive the
fork into workers; docs/ARCHITECTURE.md). So it runs
`python -m onnxpool.workers.preflight PATH`, which loads the model with one
thread, prints the ModelInfo as JSON, and exits. With `--into COPY` the child
first writes the form of the model that workers load (`session.write_mapped_copy`:
the optimised graph in COPY, its weights in a data file each worker maps), then
loads COPY exactly as a worker will: what it reports is what workers serve.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from onnxpool.config.settings import Settings
from onnxpool.workers.model_info import ModelInfo


class ModelError(ValueError):
    """The model file is missing, unreadable or not a valid ONNX model (one-line message)."""


def _first_line(text: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "unknown error")
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass(frozen=True)
class MappedCopy:
    """Where the preflight writes the copy workers load, and the settings it is written for."""

    target: Path
    optimization: str
    prepacking: bool

    def arguments(self) -> list[str]:
        return [
            "--into",
            str(self.target),
            "--optimization",
            self.optimization,
            "--prepacking",
            "on" if self.prepacking else "off",
        ]


def probe_model(path: Path, timeout: float = 300.0, into: MappedCopy | None = None) -> ModelInfo:
    """Load `path` in a subprocess (writing and loading the mapped copy `into`); its ModelInfo or ModelError."""
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist")
    extra = into.arguments() if into is not None else []
    try:
        done = subprocess.run(
            [sys.executable, "-m", "onnxpool.workers.preflight", str(path), *extra],
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
    from dataclasses import replace

    from onnxpool.workers.graph_outputs import output_producers
    from onnxpool.workers.session import OPT_LEVELS, build_session, model_info_of, write_mapped_copy

    parser = argparse.ArgumentParser(prog="python -m onnxpool.workers.preflight")
    parser.add_argument("model", type=Path)
    parser.add_argument("--into", type=Path, help="write the mapped copy here, then load it as a worker does")
    parser.add_argument("--optimization", choices=sorted(OPT_LEVELS), default="all")
    parser.add_argument("--prepacking", choices=("on", "off"), default="on")
    args = parser.parse_args(argv)
    try:  # onnxruntime is imported here, in the child only
        if args.into is None:
            session = build_session(args.model, intra_op_threads=1, optimization="disable")
        else:
            prepacking = args.prepacking == "on"
            write_mapped_copy(args.model, args.into, args.optimization, prepacking)
            session = build_session(args.into, 1, optimization=args.optimization, prepacking=prepacking)
    except Exception as exc:  # onnxruntime raises several unrelated types for bad files
        print(_first_line(str(exc)), file=sys.stderr)
        return 1
    # The producers come from the file as given: the mapped copy's graph is optimised (ops fused).
    info = replace(model_info_of(session), producers=tuple(output_producers(args.model).items()))
    print(json.dumps(info.to_dict()))
    return 0


def preflight(settings: Settings, model_file: Path | None = None, into: Path | None = None) -> ModelInfo:
    """Load the model (or `model_file`, a copy of it) in a subprocess: its inputs and outputs.

    With `into`, the subprocess writes there the mapped copy workers load, for these settings.
    What the task needs of the model (an image input, labels that fit the classes...) is the
    task's to check, when the master binds it to the model (`onnxpool.tasks.registry.build_task`)."""
    model = settings.model
    mapped = MappedCopy(into, model.graph_optimization_level, model.prepacking) if into is not None else None
    return probe_model(model_file or model.path, into=mapped)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
