"""The INT8 demo model against the FP32 one, in one run: in process and over HTTP.

Usage (from the repo root, nothing else running; docs/BENCHMARKS.md has the numbers):
    .venv/bin/python -m benchmarks.int8 [--rounds 4] [--duration 10s] [--photos DIR] [--json out.json]

0. With `--photos DIR` (held-out photos, e.g. the eval half of tools/build_object_photos.py):
   top-1 agreement, top-5 overlap and mean KL of INT8 vs FP32 (FP32 run natively) on each
   CPU family: natively (this host's kernels) and on AVX2 kernels without VNNI, under
   `qemu-x86_64 -cpu Haswell` (bit-identical to an AVX2 CPU's numbers, minutes for a few
   hundred photos); with class subfolders, top-1/top-5 accuracy of both models too.
   Emulation says nothing about speed: AVX2 speed is not measured here.
1. In process: `onnxpool limit FP32 --compare INT8`, 1 worker x 1 thread, pinned (both
   pipelines: raw tensors, and JPEG decode + preprocessing + inference), alternating
   rounds, median per-round ratio.
2. Over HTTP: two real servers up the whole run, `onnxpool serve` (FP32) and
   `onnxpool serve --config efficientnet-lite0-int8`, response cache off, `/predict` with
   the cat photo at `--concurrency` connections. An idle sync worker costs no CPU, so the two are measured
   next to each other, the order reversed every round (F I I F F I ...): this machine
   drifts by 10 % within minutes, and the alternation puts the drift into both sides.
   The ratio is the INT8 mean over the FP32 mean; the per-pair ratios show the spread.
   Measured twice: as the machine is, then (root only) with idle CPUs polling
   (measure/idle_latency.py), since a request that wakes a halted vCPU runs on cold caches.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.alternating import alternating_rounds, predict_rate
from benchmarks.output import emit
from onnxpool.config.loader import CONFIG_DIR
from onnxpool.measure.httpbench import parse_seconds
from onnxpool.measure.idle_latency import measured_polling
from onnxpool.measure.paths import DEMO_MODEL
from onnxpool.measure.servers import Server, running_server
from onnxpool.workers.cores import plan_layout, usable_cores

INT8_CONFIG = CONFIG_DIR / "efficientnet-lite0-int8.toml"
INT8_MODEL = DEMO_MODEL.parent.parent / "efficientnet-lite0-int8" / "model.onnx"


def agreement(photos: Path, int8: Path) -> dict[str, Any]:
    """INT8 vs FP32 (native) on `photos`, per CPU family: native, and AVX2 under qemu."""
    from onnxpool.config.loader import load_settings
    from onnxpool.quantize.emulate import emulated_logits
    from onnxpool.quantize.evaluate import compare_logits, run_logits
    from onnxpool.quantize.images import load_images
    from onnxpool.quantize.targets import AVX2, find_qemu
    from onnxpool.tasks.image.imaging import ImagePipeline
    from onnxpool.tasks.image.settings import image_settings
    from onnxpool.tasks.image.task import labels_file
    from onnxpool.workers.cpu_fit import cpu_flags
    from onnxpool.workers.session import build_session

    loaded = load_settings()
    image = image_settings(loaded)
    names = labels_file(image.labels, loaded.settings.model.path)
    labels = tuple(names.read_text(encoding="utf-8").splitlines()) if names is not None else ()
    pipeline = ImagePipeline(image.preprocess, loaded.settings.limits)
    images = load_images(photos, pipeline, "photos", class_names=labels)
    threads = len(usable_cores())
    ref = run_logits(build_session(DEMO_MODEL, threads), images.arrays)
    out: dict[str, Any] = {"photos": images.describe(), "int8_model": str(int8), "reference": "FP32, native"}
    session = build_session(int8, threads)
    native = run_logits(session, images.arrays)
    out["native"] = {"cpu_flags": sorted(f for f in cpu_flags() if "vnni" in f or f.startswith("avx"))}
    out["native"].update(asdict(compare_logits(ref, native, images.labels)))
    qemu = find_qemu()
    if qemu is None:
        out["avx2"] = "not evaluated: qemu-x86_64 is not installed (apt-get install qemu-user)"
        return out
    command = (qemu, "-cpu", str(AVX2.qemu_cpu))
    print(f"INT8 on AVX2 kernels under {' '.join(command)} ({len(images.names)} photos) ...", file=sys.stderr)
    t0 = time.perf_counter()
    name = session.get_inputs()[0].name
    emulated = emulated_logits(command, int8, name, images.arrays, threads, lambda text: print(text, file=sys.stderr))
    out["avx2"] = {"command": " ".join(command), "seconds": round(time.perf_counter() - t0, 1)}
    out["avx2"].update(asdict(compare_logits(ref, emulated, images.labels)))
    out["avx2_equals_native_bit_for_bit"] = bool((emulated == native).all())
    return out


def in_process(rounds: int, duration: float, int8: Path) -> str:
    """`onnxpool limit --compare`'s own report (the two models, both pipelines), 1 pinned 1-thread worker."""
    argv = [sys.executable, "-m", "onnxpool.cli", "limit", str(DEMO_MODEL), "--compare", str(int8)]
    argv += ["--rounds", str(rounds), "--duration", f"{duration:g}s", "--workers", "1", "--threads-per-worker", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=1800)
    return done.stdout


def over_http(sides: dict[str, tuple[Server, str]], args: argparse.Namespace, label: str) -> dict[str, Any]:
    """Alternating rounds (F I, I F, ...); the ratio of the means and every pair's ratio."""
    measures = {name: partial(predict_rate, server, args, model=model) for name, (server, model) in sides.items()}
    rates = alternating_rounds(measures, args.rounds, label)
    pairs = [i / f for f, i in zip(rates["fp32"], rates["int8"], strict=True)]
    return {
        "fp32_rps": [round(r, 1) for r in rates["fp32"]],
        "int8_rps": [round(r, 1) for r in rates["int8"]],
        "ratio_of_means": round(statistics.fmean(rates["int8"]) / statistics.fmean(rates["fp32"]), 3),
        "pair_ratios": [round(r, 3) for r in pairs],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.int8", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=parse_seconds, default=10.0, help="measured seconds per side (10s)")
    parser.add_argument("--warmup", type=parse_seconds, default=2.0, help="warm-up seconds per side (2s)")
    parser.add_argument("--concurrency", type=int, default=4, help="connections (default 4)")
    parser.add_argument("--rounds", type=int, default=4, help="HTTP rounds per side and mode (default 4)")
    parser.add_argument("--limit-rounds", type=int, default=3, help="`onnxpool limit` rounds (default 3)")
    parser.add_argument("--limit-duration", type=parse_seconds, default=5.0, help="per limit round (5s)")
    parser.add_argument("--photos", type=Path, help="held-out photos: agreement per CPU family (native, AVX2/qemu)")
    parser.add_argument(
        "--int8", type=Path, default=INT8_MODEL, help="INT8 model for --photos, in process and over HTTP"
    )
    parser.add_argument("--skip-speed", action="store_true", help="only the agreement of --photos")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    result: dict[str, Any] = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if args.photos is not None:
        result["agreement"] = agreement(args.photos, args.int8)
    if args.skip_speed:
        emit(result, args.json)
        return 0
    print("in process: onnxpool limit --compare ...", file=sys.stderr)
    result["limit_report"] = in_process(args.limit_rounds, args.limit_duration, args.int8)
    print(result["limit_report"], file=sys.stderr)
    workers = plan_layout(usable_cores(), "auto", "auto").workers
    # the response cache off: a benchmark repeating one photo would otherwise measure the cache
    quiet = {"ONNXPOOL_LOGGING__ACCESS_LOG": "false", "ONNXPOOL_CACHE__ENABLED": "false"}
    # over HTTP the same file as in process (--int8), not the config's pick for this CPU
    one_file = {"ONNXPOOL_MODEL__PATH": str(args.int8.resolve()), "ONNXPOOL_MODEL__CPU_VARIANTS": "[]"}
    with tempfile.TemporaryDirectory(prefix="onnxpool-int8-bench-") as tmp:
        folder = Path(tmp)
        with (
            running_server(folder, quiet, workers=workers, name="fp32") as fp32,
            running_server(folder, {**quiet, **one_file}, workers=workers, name="int8", config=INT8_CONFIG) as int8,
        ):
            sides = {"fp32": (fp32, "efficientnet-lite0"), "int8": (int8, "efficientnet-lite0-int8")}
            print("over HTTP, /predict ...", file=sys.stderr)
            result["http"] = over_http(sides, args, "as is")
            print("over HTTP, /predict, idle CPUs polling (root only) ...", file=sys.stderr)
            result["http_idle_polling"] = measured_polling(lambda: over_http(sides, args, "polling"))
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
