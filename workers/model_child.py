"""The model in a child process, for the master: inferences on the exact file workers will load.

The gunicorn master must never import onnxruntime (its thread pool would be half-copied into
every worker at fork; docs/ARCHITECTURE.md), yet it must see a task answer a request on the real
model before it forks anyone (the rehearsal, `onnxpool.tasks.rehearsal`). So the session lives in
`python -m onnxpool.workers.model_child FILE`, one thread, and the master sends it feeds over a
pipe: a frame is an 8-byte length and a pickle. Pickle is safe here: both ends are onnxpool, the
child is the master's own and the pipes are private to the two; nothing a caller sent is in them
but tensors the task made. A run that fails in onnxruntime comes back as its one-line message;
a child that dies or hangs past the deadline is a `ModelChildError` too.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np

FRAME = struct.Struct(">Q")


class ModelChildError(RuntimeError):
    """The child could not run the model (onnxruntime's message, or how the child ended)."""


def _write_frame(stream: IO[bytes], value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(FRAME.pack(len(data)) + data)
    stream.flush()


def _read_exactly(fd: int, size: int, deadline: float) -> bytes:
    chunks, left = [], size
    while left:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([fd], [], [], wait)[0]:
            raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class ModelChild:
    """A session of `model` in a child process (a context manager: the child ends with the block)."""

    def __init__(self, model: Path, optimization: str = "all", prepacking: bool = True, timeout: float = 120.0) -> None:
        self.timeout = timeout
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "onnxpool.workers.model_child",
                str(model),
                optimization,
                "on" if prepacking else "off",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def infer(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None) -> dict[str, Any]:
        """One run of the child's session: its outputs by name, or ModelChildError."""
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        try:
            _write_frame(process.stdin, (dict(feeds), list(output_names) if output_names else None))
            deadline = time.monotonic() + self.timeout
            fd = process.stdout.fileno()
            (size,) = FRAME.unpack(_read_exactly(fd, FRAME.size, deadline))
            ok, value = pickle.loads(_read_exactly(fd, size, deadline))
        except TimeoutError:
            raise ModelChildError(f"the model did not answer within {self.timeout:.0f} s") from None
        except (EOFError, BrokenPipeError):
            raise ModelChildError(self._ended()) from None
        if not ok:
            raise ModelChildError(str(value))
        return value  # type: ignore[no-any-return]

    def _ended(self) -> str:
        """Why the child stopped answering (its exit, and the last line it wrote)."""
        process = self._process
        try:
            code = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        stderr = process.stderr.read().decode(errors="replace") if process.stderr is not None else ""
        last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"the model's process {how}" + (f": {last[:300]}" if last else "")

    def close(self) -> None:
        process = self._process
        if process.poll() is None:
            assert process.stdin is not None
            try:
                process.stdin.close()  # the child's loop ends at end of input
                process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> ModelChild:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _serve(model: Path, optimization: str, prepacking: bool) -> int:
    from onnxpool.workers.session import build_session  # onnxruntime: in the child only

    session = build_session(model, 1, optimization=optimization, prepacking=prepacking)
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = requests.read(FRAME.size)
        if len(header) < FRAME.size:
            return 0  # the master closed the pipe: done
        feeds, names = pickle.loads(requests.read(FRAME.unpack(header)[0]))
        names = names or [output.name for output in session.get_outputs()]
        try:
            outputs = session.run(names, feeds)
        except Exception as exc:  # onnxruntime's own types (InvalidArgument, Fail...): one line for the master
            message = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            _write_frame(replies, (False, message))
            continue
        _write_frame(replies, (True, dict(zip(names, outputs, strict=True))))


if __name__ == "__main__":
    raise SystemExit(_serve(Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "on"))
