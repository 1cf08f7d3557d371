"""How long one image takes from upload bytes to model input: plain Pillow+numpy vs ImagePipeline.

Usage (from the repo root):  .venv/bin/python -m benchmarks.preprocess_bench [--runs 200] [--plot out/pre.png]

Cases: the 451x300 cat photo, and a 1920x1920 JPEG (the cat upscaled in memory,
quality 90) where the pipeline's reduced-scale JPEG decoding matters. Each
timing is the median (and 90th percentile) over --runs calls after --warmup
calls, single-threaded, on whatever cores this process may use.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from onnxpool.config.settings import LimitsSettings
from onnxpool.measure.paths import CAT_JPEG
from onnxpool.tasks.image.imaging import ImagePipeline, resized_size
from onnxpool.tasks.image.settings import PreprocessSettings

CAT = CAT_JPEG


def baseline(spec: PreprocessSettings) -> Callable[[bytes], np.ndarray[Any, Any]]:
    """The straightforward pipeline: decode all, convert, resize all, crop, normalise in float."""
    mean = np.asarray(spec.mean, np.float32)
    std = np.asarray(spec.std, np.float32)

    def run(data: bytes) -> np.ndarray[Any, Any]:
        im = Image.open(io.BytesIO(data)).convert("RGB")
        new_w, new_h = resized_size(*im.size, spec.resize)
        im = im.resize((new_w, new_h), Image.Resampling.BILINEAR)
        left, top = (new_w - spec.crop) // 2, (new_h - spec.crop) // 2
        im = im.crop((left, top, left + spec.crop, top + spec.crop))
        x = (np.asarray(im, dtype=np.float32) * spec.scale - mean) / std
        return np.ascontiguousarray(x.transpose(2, 0, 1))[None]

    return run


def median_ms(fn: Callable[[bytes], object], data: bytes, runs: int, warmup: int, label: str) -> tuple[float, float]:
    """(median, p90) milliseconds per call, with a progress counter on stderr."""
    for _ in range(warmup):
        fn(data)
    times = []
    for i in range(runs):
        started = time.perf_counter()
        fn(data)
        times.append(time.perf_counter() - started)
        if sys.stderr.isatty() and (i % 20 == 19 or i == runs - 1):
            print(f"\r  {label}: {i + 1}/{runs}", end="", file=sys.stderr, flush=True)
    print(f"\r  {label}: {runs}/{runs} done", file=sys.stderr, flush=True)
    return float(np.median(times) * 1e3), float(np.percentile(times, 90) * 1e3)


def plot(rows: list[tuple[str, float, float]], path: Path) -> None:
    """A bar chart PNG drawn with Pillow (no plotting library needed)."""
    width, bar, gap, label_w = 720, 22, 10, 200
    height = 40 + len(rows) * 2 * (bar + 4) + len(rows) * gap
    im = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(im)
    top = max(max(b, p) for _, b, p in rows)
    draw.text((10, 10), "ms per image (median): grey = baseline, blue = ImagePipeline", fill="black")
    y = 36
    for name, base_ms, pipe_ms in rows:
        for value, colour in ((base_ms, (150, 150, 150)), (pipe_ms, (40, 100, 200))):
            length = int((width - label_w - 80) * value / top)
            draw.rectangle((label_w, y, label_w + length, y + bar), fill=colour)
            draw.text((label_w + length + 6, y + 5), f"{value:.2f}", fill="black")
            y += bar + 4
        draw.text((10, y - bar - 10), name, fill="black")
        y += gap
    path.parent.mkdir(parents=True, exist_ok=True)
    im.save(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=200, help="timed calls per case (default 200)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed calls first (default 20)")
    parser.add_argument("--big", type=int, default=1920, help="side of the generated large JPEG (default 1920)")
    parser.add_argument("--plot", type=Path, help="also write a bar chart PNG here")
    args = parser.parse_args(argv)

    spec = PreprocessSettings()
    pipeline = ImagePipeline(spec, LimitsSettings())
    cat = CAT.read_bytes()
    big_im = Image.open(io.BytesIO(cat)).convert("RGB").resize((args.big, args.big), Image.Resampling.BICUBIC)
    big = io.BytesIO()
    big_im.save(big, "JPEG", quality=90)
    cases = [("cat JPEG 451x300", cat), (f"JPEG {args.big}x{args.big}", big.getvalue())]
    plain = baseline(spec)

    def ours(data: bytes) -> object:
        return pipeline.preprocess_batch([data])

    print(f"preprocess: resize {spec.resize}, crop {spec.crop}, {spec.layout} {spec.dtype}; {args.runs} runs")
    rows: list[tuple[str, float, float]] = []
    table: list[tuple[str, float, float, float, float]] = []
    for name, data in cases:
        base_med, base_p90 = median_ms(plain, data, args.runs, args.warmup, f"{name} baseline")
        pipe_med, pipe_p90 = median_ms(ours, data, args.runs, args.warmup, f"{name} ImagePipeline")
        rows.append((name, base_med, pipe_med))
        table.append((name, base_med, base_p90, pipe_med, pipe_p90))

    print(f"{'image':<20} {'baseline ms':>12} {'p90':>7} {'pipeline ms':>12} {'p90':>7} {'speed-up':>9}")
    for name, base_med, base_p90, pipe_med, pipe_p90 in table:
        speed_up = base_med / pipe_med
        print(f"{name:<20} {base_med:>12.2f} {base_p90:>7.2f} {pipe_med:>12.2f} {pipe_p90:>7.2f} {speed_up:>8.1f}x")
    if args.plot:
        plot(rows, args.plot)
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
