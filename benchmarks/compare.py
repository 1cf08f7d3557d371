"""Side-by-side benchmark for docs/BENCHMARKS.md: onnxpool vs its in-process limit and vs FastAPI/uvicorn.

One run, one machine, same load generator and same request bytes. The servers
are all started first and stay up, idle while another one is measured (an idle
sync worker or uvicorn worker uses no CPU), so that the numbers forming each
ratio are measured next to each other: this machine's speed drifts by 10%
and more within minutes, and measuring one server after the other would put
that drift into the ratios.
  1. v2 binary tensors: the in-process limit (`bench.limit`, onnxpool's default
     layout, raw tensors), onnxpool at each concurrency, gunicorn's floor, then
     the limit again (the ratios use the mean of both; their difference is
     the drift within the run);
  2. /predict with the cat JPEG: the in-process limit of the image pipeline
     (JPEG decode + preprocess + inference), then at each concurrency onnxpool
     and the baseline one right after the other, gunicorn's floor, and a
     1920x1920 JPEG (the cat upscaled) on onnxpool at concurrency 4.
gunicorn's floor is a bare WSGI app (`benchmarks/baselines/floor_wsgi.py`) under the
same number of sync workers, sent the same request at concurrency 4. It does
no work, so what it costs per request is what ANY gunicorn sync server pays
here; with the limits it gives the best ratio a server on this stack could
reach. The baseline is `benchmarks/baselines/fastapi_app.py` under `uvicorn --workers
N` (N = usable cores), started through `benchmarks/baselines/uvicorn_nodelay.py`
(see there). Writes a markdown table (ratios included) and a PNG plot.

    python -m benchmarks.compare --duration 20s --markdown docs/benchmarks-latest.md --plot docs/benchmarks.png
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks.floor import start_floor_app
from onnxpool.measure.httpbench import BenchOptions, parse_seconds, parse_steps, run_bench
from onnxpool.measure.limit import LimitPlan, measure_limit
from onnxpool.measure.loadgen import StepResult
from onnxpool.measure.paths import CAT_JPEG, DEMO_MODEL, MODEL_NAME
from onnxpool.measure.payloads import PreparedRequest, infer_path, predict_request, prepare
from onnxpool.measure.progress import Progress
from onnxpool.measure.servers import Server, free_port, start_command, start_server
from onnxpool.workers.cores import plan_layout, usable_cores


def _bench(
    url: str, request: PreparedRequest, steps: Sequence[int], args: argparse.Namespace, progress: Progress
) -> list[StepResult]:
    options = BenchOptions(
        url=url,
        mode="predict" if request.path != INFER_PATH else "v2-binary",
        concurrency=tuple(steps),
        warmup=args.warmup,
        duration=args.duration,
        model=MODEL_NAME,
    )
    return run_bench(options, progress, request).steps


BASELINE_APP = "benchmarks.baselines.fastapi_app:app"


def start_baseline(
    log_dir: Path,
    workers: int | None,
    stock: bool = False,
    *,
    app: str = BASELINE_APP,
    env: dict[str, str] | None = None,
    name: str = "baseline",
) -> Server:
    """A FastAPI baseline under uvicorn (`workers` None: one process, no --workers) on a free port."""
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn" if stock else "benchmarks.baselines.uvicorn_nodelay", app]
    if workers is not None:
        argv += ["--workers", str(workers)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
    return start_command(argv, log_dir, port, "/health", env=env, name=name, timeout=120, cwd=REPO)


BIG_IMAGE_CONCURRENCY = 4
INFER_PATH = infer_path(MODEL_NAME)


def _big_jpeg(folder: Path, source: Path) -> Path:
    """A 1920x1920 JPEG (quality 90) made by upscaling `source`: a typical phone-sized upload."""
    from PIL import Image

    target = folder / "big-1920.jpg"
    with Image.open(source) as im:
        im.convert("RGB").resize((1920, 1920), Image.Resampling.BICUBIC).save(target, "JPEG", quality=90)
    return target


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if a > 0 and b > 0 else "-"


def _fmt(step: StepResult) -> tuple[str, str]:
    if step.ok == 0:
        return "failed", "-"
    return f"{step.items_per_second:.1f}", f"{step.percentile(99) * 1000:.1f}"


def _ceiling_rows(results: dict[str, Any]) -> list[str]:
    """What the stack allows: per-image work in-process + gunicorn's floor per request, vs what onnxpool got."""
    workers = int(results["layout"].split("x")[0])
    limit, floor = results["limit"], results.get("floor") or {}
    rows = []
    cases = (
        ("v2 binary tensors", "binary", limit, "onnxpool_binary", "inference"),
        (
            "/predict, cat JPEG",
            "predict",
            results.get("limit_image", 0.0),
            "onnxpool_predict",
            "decode + preprocess + inference",
        ),
    )
    for label, key, in_process, measured_key, work in cases:
        floor_rate = floor.get(key, 0.0)
        if not (in_process and floor_rate and limit):
            continue
        work_ms, floor_ms = 1000 * workers / in_process, 1000 * workers / floor_rate
        best = 1000 * workers / (work_ms + floor_ms)
        got = next((s for s in results[measured_key] if s.concurrency == BIG_IMAGE_CONCURRENCY), None)
        rate = got.items_per_second if got is not None and got.ok else 0.0
        rows.append(
            f"| {label} | {work_ms:.2f} ms ({work}) | {floor_ms:.2f} ms | {best:.1f} img/s = "
            f"{_ratio(best, limit)} | {rate:.1f} img/s = {_ratio(rate, limit)} |"
        )
    return rows


def markdown(results: dict[str, Any]) -> str:
    """The tables for docs/BENCHMARKS.md from one compare run."""
    limit, layout = results["limit"], results["layout"]
    lines = [
        f"Measured {results['when']} on {results['cores']} usable cores, onnxpool layout {layout}, "
        f"{results['duration']:.0f} s per step after {results['warmup']:.0f} s warm-up.",
        "",
        "| what | concurrency | img/s | p99 ms | vs in-process limit |",
        "|---|---|---|---|---|",
        f"| in-process limit (raw tensors, no HTTP; mean of {results['limit_runs'][0]:.1f} before and "
        f"{results['limit_runs'][1]:.1f} after the onnxpool steps) | - | {limit:.1f} | - | 1.00x |",
    ]
    for step in results["onnxpool_binary"]:
        rate, p99 = _fmt(step)
        lines.append(
            f"| onnxpool, v2 binary tensors | {step.concurrency} | {rate} | {p99} | "
            f"{_ratio(step.items_per_second, limit)} |"
        )
    baseline_name = "stock uvicorn" if results.get("baseline_stock") else "uvicorn, TCP_NODELAY fixed"
    lines += [
        "",
        f"| /predict, cat JPEG | concurrency | onnxpool img/s | onnxpool p99 ms | baseline ({baseline_name}) img/s "
        "| baseline p99 ms | throughput ratio | p99 ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ours, base in zip(results["onnxpool_predict"], results["baseline_predict"], strict=True):
        (r1, p1), (r2, p2) = _fmt(ours), _fmt(base)
        p99_ratio = ours.percentile(99) / base.percentile(99) if ours.ok and base.ok else float("nan")
        lines.append(
            f"| | {ours.concurrency} | {r1} | {p1} | {r2} | {p2} | "
            f"{_ratio(ours.items_per_second, base.items_per_second)} | "
            + (f"{p99_ratio:.2f}x |" if p99_ratio == p99_ratio else "- |")
        )
    big = results.get("onnxpool_predict_big") or []
    if big:
        lines += [
            "",
            "| /predict, onnxpool | concurrency | img/s | p99 ms | vs in-process limit |",
            "|---|---|---|---|---|",
        ]
        for label, steps in (("cat JPEG 451x300", results["onnxpool_predict"]), ("JPEG 1920x1920", big)):
            for step in steps:
                if step.concurrency == BIG_IMAGE_CONCURRENCY:
                    rate, p99 = _fmt(step)
                    lines.append(
                        f"| {label} | {step.concurrency} | {rate} | {p99} | {_ratio(step.items_per_second, limit)} |"
                    )
    ceiling = _ceiling_rows(results)
    if ceiling:
        lines += [
            "",
            f"What the stack allows at concurrency {BIG_IMAGE_CONCURRENCY} (per worker; the floor is a bare gunicorn "
            "sync app sent the same request, load generator and kernel included):",
            "",
            "| request | work per image in-process | gunicorn floor per request | best possible (work + floor) "
            "| onnxpool |",
            "|---|---|---|---|---|",
            *ceiling,
        ]
    lines += ["", f"Load generator CPU: {results['client_cpu']}"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=parse_seconds, default=20.0, help="measured seconds per step (20s)")
    parser.add_argument("--warmup", type=parse_seconds, default=3.0, help="warm-up seconds per step (3s)")
    parser.add_argument("--concurrency", type=parse_steps, default=(1, 2, 4, 8), help="steps (default 1,2,4,8)")
    parser.add_argument("--image", type=Path, default=CAT_JPEG, help="JPEG for /predict (the cat)")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    parser.add_argument("--plot", type=Path, help="write the PNG plot here")
    parser.add_argument("--skip-baseline", action="store_true", help="only onnxpool, the limits and the floor")
    parser.add_argument(
        "--baseline",
        choices=("nodelay", "stock"),
        default="nodelay",
        help="uvicorn as shipped ('stock'), or with its TCP_NODELAY bug worked around (default)",
    )
    args = parser.parse_args(argv)
    if not args.skip_baseline and not all(importlib.util.find_spec(m) for m in ("fastapi", "uvicorn", "multipart")):
        print("the baseline needs: pip install 'onnxpool[baseline]' (or use --skip-baseline)", file=sys.stderr)
        return 2

    progress = Progress()
    cores = usable_cores()
    layout = plan_layout(cores, "auto", "auto")
    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "cores": len(cores),
        "layout": f"{layout.workers}x{layout.threads}",
        "duration": args.duration,
        "warmup": args.warmup,
        "baseline_stock": args.baseline == "stock",
    }
    raw_plan = LimitPlan(DEMO_MODEL, layout, duration=args.duration, warmup=args.warmup)
    image_plan = LimitPlan(
        DEMO_MODEL, layout, pipeline="image", image=args.image.read_bytes(), duration=args.duration, warmup=args.warmup
    )
    with tempfile.TemporaryDirectory(prefix="onnxpool-compare-") as tmp, contextlib.ExitStack() as running:
        folder = Path(tmp)
        progress.done("starting onnxpool, the floor app" + ("" if args.skip_baseline else " and the baseline"))
        server = start_server(folder, {"ONNXPOOL_LOGGING__ACCESS_LOG": "false"}, workers=layout.workers)
        running.callback(server.stop)
        floor_app = start_floor_app(folder, layout.workers)
        running.callback(floor_app.stop)
        baseline = None
        if not args.skip_baseline:
            baseline = start_baseline(folder, len(cores), stock=args.baseline == "stock")
            running.callback(baseline.stop)
        binary = prepare("v2-binary", server.url, model=MODEL_NAME)
        predict = predict_request(args.image, 1)
        big = predict_request(_big_jpeg(folder, args.image), 1)
        floor_steps = (BIG_IMAGE_CONCURRENCY,)

        progress.done(f"1/2 v2 binary tensors: limit ({layout.workers}x{layout.threads}), onnxpool, floor, limit")
        before = measure_limit(raw_plan).items_per_second
        results["onnxpool_binary"] = _bench(server.url, binary, args.concurrency, args, progress)
        results["floor"] = {"binary": _bench(floor_app.url, binary, floor_steps, args, progress)[0].throughput}
        after = measure_limit(raw_plan).items_per_second
        results["limit"], results["limit_runs"] = (before + after) / 2, (before, after)

        progress.done("2/2 /predict: image-pipeline limit, then onnxpool and the baseline in turn, floor, big JPEG")
        results["limit_image"] = measure_limit(image_plan).items_per_second
        ours: list[StepResult] = []
        theirs: list[StepResult] = []
        for concurrency in args.concurrency:
            ours += _bench(server.url, predict, (concurrency,), args, progress)
            if baseline is not None:
                theirs += _bench(baseline.url, predict, (concurrency,), args, progress)
            else:
                theirs.append(StepResult(concurrency, 1.0, _empty()))
        results["onnxpool_predict"], results["baseline_predict"] = ours, theirs
        results["floor"]["predict"] = _bench(floor_app.url, predict, floor_steps, args, progress)[0].throughput
        results["onnxpool_predict_big"] = _bench(server.url, big, floor_steps, args, progress)
    cpu_notes = []
    for name in ("onnxpool_binary", "onnxpool_predict", "onnxpool_predict_big", "baseline_predict"):
        per = [f"{s.client_cpu_per_request * 1000:.2f}" for s in results[name] if s.requests]
        cpu_notes.append(f"{name} {'/'.join(per) or '-'} ms per request")
    results["client_cpu"] = ", ".join(cpu_notes)
    text = markdown(results)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.plot:
        from onnxpool.measure.plot import plot_series

        series = {
            "onnxpool v2 binary": [s.summary() for s in results["onnxpool_binary"]],
            "onnxpool /predict": [s.summary() for s in results["onnxpool_predict"]],
        }
        if not args.skip_baseline:
            series["FastAPI+uvicorn /predict"] = [s.summary() for s in results["baseline_predict"]]
        plot_series(args.plot, series, title=f"efficientnet-lite0, {len(cores)} cores ({results['when']})")
    return 0


def _empty() -> Any:
    import numpy as np

    return np.empty(0)


if __name__ == "__main__":
    raise SystemExit(main())
