"""Logits of a model on kernels this CPU does not use: onnxruntime under qemu's user-mode emulator.

`qemu-x86_64 -cpu Haswell python -m onnxpool.quantize.emulate MODEL IMAGES.npy OUT.npy` runs the
whole Python process on an emulated AVX2 CPU without AVX512 or VNNI, so onnxruntime's CPU
detection picks its AVX2 kernels and the numbers are those an AVX2 server computes (checked:
`-cpu Haswell` and `-cpu Skylake-Client` agree bit for bit and differ from this VNNI host).
It is slow (~1-2 s per 224x224 EfficientNet-Lite0 image), so the images are split over the
usable cores, one emulated process each, with a progress bar and an estimate of the time left.

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


def emulated_logits(
    command: Sequence[str],
    model: Path,
    images: np.ndarray,
    processes: int,
    status: Callable[[str], None] | None = None,
    what: str = "emulated",
) -> np.ndarray:
    """Run `model` on `images` under `command` (qemu-x86_64 -cpu MODEL), split over `processes`.

    `status(text)` receives progress lines (a bar, images done, minutes left).
    """
    n = len(images)
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
                np.save(work / f"in{k}.npy", images[chunk])
                proc = subprocess.Popen(
                    [*command, sys.executable, "-m", "onnxpool.quantize.emulate", str(model), *_files(work, k)],
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
                    status(f"{what}: {bar(total / n)} {total}/{n} images{left}")
            out = []
            for k, proc in enumerate(procs):
                if proc.wait() != 0:
                    last = errors[k][-1] if errors[k] else f"exit code {proc.returncode}"
                    raise QuantizeError(f"{what}: the emulated run ({' '.join(command)}) failed: {last}")
                out.append(np.load(work / f"out{k}.npy"))
        finally:
            for proc in procs:  # Ctrl-C or an error: stop exactly the processes started here
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                if proc.stderr is not None:
                    proc.stderr.close()
            selector.close()
    return np.concatenate(out).reshape(n, -1).astype(np.float32)


def _files(work: Path, k: int) -> list[str]:
    return [str(work / f"in{k}.npy"), str(work / f"out{k}.npy")]


def main(argv: list[str]) -> int:
    """Child: MODEL IMAGES.npy OUT.npy; one image per run (one thread), a progress line after each."""
    from onnxpool.workers.session import build_session  # the server's own session options

    model, images_file, out_file = argv
    session = build_session(Path(model), 1)
    name = session.get_inputs()[0].name
    images = np.load(images_file)
    outs = []
    for i in range(len(images)):
        outs.append(np.asarray(session.run(None, {name: images[i : i + 1]})[0], dtype=np.float32))
        print(f"progress {i + 1}", file=sys.stderr, flush=True)
    np.save(out_file, np.concatenate(outs) if outs else np.zeros((0,), np.float32))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
