"""Logits of a model on kernels this CPU does not use: onnxruntime under qemu's user-mode emulator.

`qemu-x86_64 -cpu Haswell python -m onnxpool.quantize.emulate MODEL ITEMS.npz OUT.npz` runs the
whole Python process on an emulated AVX2 CPU without AVX512 or VNNI, so onnxruntime's CPU
detection picks its AVX2 kernels and the numbers are those an AVX2 server computes (checked:
`-cpu Haswell` and `-cpu Skylake-Client` agree bit for bit and differ from this VNNI host).
It is slow (~1-2 s per 224x224 EfficientNet-Lite0 image), so the items (one run's feeds each:
an image, or a sub-batch of tokenized sentences) are split over the usable cores, one
emulated process each, with a progress bar and an estimate of the time left.

The child part (`main`) builds its session as the server does (`workers.session.build_session`,
one thread) and imports little else: everything it imports is emulated.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from onnxpool.measure.progress import bar
from onnxpool.quantize.errors import QuantizeError

QEMU_NOISE = "qemu-x86_64: warning:"  # TCG lists CPUID bits it cannot emulate (pcid, x2apic...): not ours


Feeds = dict[str, np.ndarray]


def emulated_logits(
    command: Sequence[str],
    model: Path,
    input_name: str,
    images: np.ndarray,
    processes: int,
    status: Callable[[str], None] | None = None,
    what: str = "emulated",
) -> np.ndarray:
    """The model's first output for each image ([N, ...] -> [N, -1]), one image per run."""
    items = [{input_name: images[i : i + 1]} for i in range(len(images))]
    outs = emulated_outputs(command, model, items, processes, status, what, "images")
    return np.concatenate(outs).reshape(len(images), -1).astype(np.float32)


def emulated_outputs(
    command: Sequence[str],
    model: Path,
    items: Sequence[Feeds],
    processes: int,
    status: Callable[[str], None] | None = None,
    what: str = "emulated",
    unit: str = "runs",
    output: str | None = None,
) -> list[np.ndarray]:
    """Run `model` once per item of `items` (feeds by input name) under `command` (qemu-x86_64
    -cpu MODEL), split over `processes`; the output named `output` (default: the first) of
    each run, in order.

    `status(text)` receives progress lines (a bar, items done, minutes left).
    """
    n = len(items)
    chunks = [c for c in np.array_split(np.arange(n), max(1, min(processes, n))) if len(c)]
    with tempfile.TemporaryDirectory(prefix="onnxpool-emulate-") as tmp:
        work = Path(tmp)
        procs: list[subprocess.Popen[bytes]] = []
        done = [0] * len(chunks)
        errors: list[list[str]] = [[] for _ in chunks]
        selector = selectors.DefaultSelector()
        start = time.perf_counter()
        try:
            for k, chunk in enumerate(chunks):
                save_arrays(
                    work / f"in{k}.npz",
                    {f"{j}{SEP}{name}": value for j, i in enumerate(chunk) for name, value in items[int(i)].items()},
                )
                proc = subprocess.Popen(
                    [
                        *command,
                        sys.executable,
                        "-m",
                        "onnxpool.quantize.emulate",
                        str(model),
                        *_files(work, k),
                        *([output] if output else []),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                )
                procs.append(proc)
                assert proc.stderr is not None
                os.set_blocking(proc.stderr.fileno(), False)
                selector.register(proc.stderr, selectors.EVENT_READ, k)
            buffers = [b""] * len(chunks)
            open_pipes = len(chunks)
            while open_pipes:
                for key, _ in selector.select(timeout=1.0):
                    k = int(key.data)
                    data = key.fileobj.read()  # type: ignore[union-attr]
                    if not data:
                        selector.unregister(key.fileobj)
                        open_pipes -= 1
                        continue
                    buffers[k] += data
                    *lines, buffers[k] = buffers[k].split(b"\n")
                    for raw in lines:
                        line = raw.decode(errors="replace").strip()
                        if line.startswith("progress "):
                            done[k] = int(line.split()[1])
                        elif line and not line.startswith(QEMU_NOISE):
                            errors[k].append(line)
                if status is not None:
                    total = sum(done)
                    elapsed = time.perf_counter() - start
                    left = f", ~{elapsed / total * (n - total) / 60:.1f} min left" if total else ", starting"
                    status(f"{what}: {bar(total / n)} {total}/{n} {unit}{left}")
            out: list[np.ndarray] = []
            for k, proc in enumerate(procs):
                if proc.wait() != 0:
                    last = errors[k][-1] if errors[k] else f"exit code {proc.returncode}"
                    raise QuantizeError(f"{what}: the emulated run ({' '.join(command)}) failed: {last}")
                with np.load(work / f"out{k}.npz") as results:
                    out.extend(results[str(j)] for j in range(len(chunks[k])))
        finally:
            for proc in procs:  # Ctrl-C or an error: stop exactly the processes started here
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                if proc.stderr is not None:
                    proc.stderr.close()
            selector.close()
    return out


SEP = "/"  # item index / input name, the keys of the child's input file


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez with names from data (numpy's stubs would read a key `allow_pickle` as its flag)."""
    np.savez(path, **arrays)  # type: ignore[arg-type]


def _files(work: Path, k: int) -> list[str]:
    return [str(work / f"in{k}.npz"), str(work / f"out{k}.npz")]


def main(argv: list[str]) -> int:
    """Child: MODEL ITEMS.npz OUT.npz [OUTPUT]; one run per item (one thread), a progress line after each."""
    from onnxpool.workers.session import build_session  # the server's own session options

    model, items_file, out_file, *wanted = argv
    session = build_session(Path(model), 1)
    items: dict[int, Feeds] = {}
    with np.load(items_file) as data:
        for key in data.files:
            index, name = key.split(SEP, 1)
            items.setdefault(int(index), {})[name] = data[key]
    outs = {}
    for j in range(len(items)):
        outs[str(j)] = np.asarray(session.run(wanted or None, items[j])[0], dtype=np.float32)
        print(f"progress {j + 1}", file=sys.stderr, flush=True)
    save_arrays(Path(out_file), outs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
