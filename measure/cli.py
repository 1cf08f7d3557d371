"""Arguments and entry points of `onnxpool bench|limit|tune` (registered by `onnxpool.cli`).

Each `*_command(args)` validates its arguments into an options object, runs the
measurement from its own module, prints a table, and returns an exit code.
Errors an operator can fix are one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from onnxpool.measure.paths import CAT_JPEG


def _seconds(text: str) -> float:
    from onnxpool.measure.httpbench import parse_seconds

    try:
        return parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _steps(text: str) -> tuple[int, ...]:
    from onnxpool.measure.httpbench import parse_steps, unique_steps

    try:
        return unique_steps(parse_steps(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text!r}")
    return value


def _output_path(text: str) -> Path:
    path = Path(text)
    if path.suffix.lower() not in (".csv", ".json"):
        raise argparse.ArgumentTypeError(f"must end in .csv or .json, got {text!r}")
    return path


def _png_path(text: str) -> Path:
    path = Path(text)
    if path.suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"must end in .png, got {text!r}")
    return path


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--mode",
        choices=("v2-binary", "v2-json", "predict"),
        default="v2-binary",
        help="v2 infer with binary tensors (default), v2 infer with JSON tensors, or POST /predict with --image",
    )
    parser.add_argument("--concurrency", type=_steps, default=(1, 2, 4, 8), help="steps, e.g. 1,2,4,8 (default)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--duration", type=_seconds, help="measured time per step, e.g. 10s (default 10s)")
    length.add_argument("--requests", type=positive, help="measured requests per step instead of a duration")
    parser.add_argument("--warmup", type=_seconds, default=2.0, help="unmeasured warm-up per step (default 2s)")
    parser.add_argument("--model", help="model name (default: [model].name of the config)")
    parser.add_argument("--config", help="TOML settings file to read the model name from")
    parser.add_argument("--batch", type=positive, default=1, help="batch size / images per request (default 1)")
    parser.add_argument("--image", type=Path, default=None, help=f"image for --mode predict (default {CAT_JPEG.name})")
    parser.add_argument(
        "--repeat-fraction",
        type=fraction,
        help="--mode predict: this fraction (0..1) of requests repeats earlier images, Zipf-distributed; the "
        "others are new variants of --image (measures the response cache; default: always the same image)",
    )
    parser.add_argument(
        "--connections-per-process", type=positive, default=2, help="client connections per load process (default 2)"
    )
    parser.add_argument("--output", type=_output_path, help="write the steps to a .csv or .json file")
    parser.add_argument("--plot", type=_png_path, help="write a PNG: throughput and p99 vs concurrency")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _model_name(explicit: str | None, config: str | None) -> str:
    if explicit:
        return explicit
    from onnxpool.config.loader import load_settings

    return load_settings(config).settings.model.name


def bench_command(args: argparse.Namespace) -> int:
    from onnxpool.config.loader import ConfigError
    from onnxpool.measure.httpbench import BenchOptions, client_cpu_note, run_bench
    from onnxpool.measure.plot import PlotUnavailable, plot_series
    from onnxpool.measure.progress import Progress
    from onnxpool.measure.report import format_table, step_rows, write_output

    image = args.image
    if args.mode == "predict":
        image = image or CAT_JPEG
        if not image.is_file():
            return fail(f"--image {image} is not a file")
    try:
        options = BenchOptions(
            url=args.url.rstrip("/"),
            mode=args.mode,
            concurrency=args.concurrency,
            warmup=args.warmup,
            duration=None if args.requests else (args.duration or 10.0),
            requests=args.requests,
            model=_model_name(args.model, args.config),
            batch=args.batch,
            image=image,
            conns_per_process=args.connections_per_process,
            repeat_fraction=args.repeat_fraction,
        )
        report = run_bench(options, Progress(enabled=not args.quiet))
    except (ConfigError, ValueError, OSError) as exc:
        return fail(str(exc))
    rows = step_rows(report.steps)
    repeats = "" if options.repeat_fraction is None else f", {options.repeat_fraction:g} of requests repeat"
    print(f"# {options.mode} against {options.url} (model {options.model}, batch {options.batch}{repeats})")
    print(format_table(rows))
    print(client_cpu_note(report))
    if args.output:
        write_output(args.output, rows, report.meta())
        print(f"wrote {args.output}")
    if args.plot:
        try:
            plot_series(
                args.plot, {f"{options.mode}{repeats} {options.url}": rows}, title=f"onnxpool bench: {options.model}"
            )
        except PlotUnavailable as exc:
            return fail(str(exc))
        print(f"wrote {args.plot}")
    failed = sum(s.ok for s in report.steps) == 0
    return 1 if failed else 0


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", type=Path, help="ONNX file (default: [model].path of the config)")
    parser.add_argument("--config", help="TOML settings file (model path, preprocessing, spin)")
    parser.add_argument("--workers", type=positive, help="processes (default: as `serve` would start)")
    parser.add_argument("--threads-per-worker", type=positive, help="intra-op threads = cores per process")
    parser.add_argument("--batch", type=positive, default=1, help="batch size per inference (default 1)")
    parser.add_argument("--duration", type=_seconds, default=5.0, help="measured seconds (default 5s)")
    parser.add_argument("--warmup", type=_seconds, default=1.0, help="unmeasured seconds first (default 1s)")
    parser.add_argument(
        "--pipeline",
        choices=("raw", "image", "both"),
        default="both",
        help="raw tensors, decode+preprocess+infer of --image, or both (default; image skipped if unavailable)",
    )
    parser.add_argument("--image", type=Path, default=CAT_JPEG, help=f"image for the image pipeline ({CAT_JPEG.name})")
    parser.add_argument(
        "--compare",
        type=Path,
        action="append",
        default=[],
        metavar="MODEL",
        help="also measure this ONNX file (e.g. the INT8 model), same layout and pipeline, in alternating rounds",
    )
    parser.add_argument("--rounds", type=positive, help="measurements per model (default 1; 3 with --compare)")


def limit_command(args: argparse.Namespace) -> int:
    import numpy as np

    from onnxpool.config.loader import ConfigError, load_settings
    from onnxpool.measure.limit import LimitPlan, image_pipeline_available, measure_alternating, median_ratio
    from onnxpool.measure.report import format_table
    from onnxpool.tasks.image.settings import image_settings
    from onnxpool.workers.cores import plan_layout, usable_cores

    try:
        loaded = load_settings(args.config)
        preprocess = image_settings(loaded).preprocess
    except ConfigError as exc:
        return fail(str(exc))
    settings = loaded.settings
    model = args.model or settings.model.path
    for path in (model, *args.compare):
        if not Path(path).is_file():
            return fail(f"model file {path} does not exist")
    workers = args.workers or settings.server.workers
    threads = args.threads_per_worker or settings.server.threads_per_worker
    layout = plan_layout(usable_cores(), workers, threads)
    pipelines = ["raw", "image"] if args.pipeline == "both" else [args.pipeline]
    if "image" in pipelines and not image_pipeline_available():
        if args.pipeline == "image":
            return fail("the image pipeline (server.imaging) is not installed in this onnxpool")
        print("image pipeline: skipped (server.imaging is not installed)", file=sys.stderr)
        pipelines.remove("image")
    models = {str(m): Path(m) for m in (model, *args.compare)}
    rounds = args.rounds or (3 if args.compare else 1)
    rows = []
    for pipeline in pipelines:
        plans = {
            name: LimitPlan(
                path,
                layout,
                batch=args.batch,
                pipeline=pipeline,  # type: ignore[arg-type]
                duration=args.duration,
                warmup=args.warmup,
                spin=settings.server.spin,
                optimization=settings.model.graph_optimization_level,
                image=args.image.read_bytes() if pipeline == "image" else None,
                preprocess=preprocess,
                limits=settings.limits,
            )
            for name, path in models.items()
        }

        def step(r: int, name: str, pipeline: str = pipeline) -> None:
            print(
                f"measuring {pipeline} of {Path(name).name} on {layout.workers}x{layout.threads} "
                f"for {args.duration:.0f}s (round {r + 1}/{rounds}) ...",
                file=sys.stderr,
            )

        results = measure_alternating(plans, rounds, step)
        first = next(iter(models))
        for name, measured in results.items():
            latencies = np.concatenate([r.latencies for r in measured]) * 1000
            row = {
                **measured[0].summary(),
                "model": name,
                "items_per_s": round(float(np.median([r.items_per_second for r in measured])), 2),
                "vs_first": round(median_ratio(results, name, first), 3),
                "p50_ms": round(float(np.percentile(latencies, 50)), 2) if latencies.size else float("nan"),
                "p99_ms": round(float(np.percentile(latencies, 99)), 2) if latencies.size else float("nan"),
            }
            rows.append(row)
    columns = (
        ("pipeline", "pipeline", "{}"),
        *((("model", "model", "{}"),) if args.compare else ()),
        ("layout", "workers x threads", "{}"),
        ("batch", "batch", "{}"),
        ("items_per_s", "items/s", "{:.1f}"),
        *((("vs_first", f"x {Path(first).name}", "{:.2f}"),) if args.compare else ()),
        ("p50_ms", "p50 ms/call", "{:.1f}"),
        ("p99_ms", "p99 ms/call", "{:.1f}"),
    )
    rounds_note = f", median of {rounds} alternating rounds" if rounds > 1 else ""
    print(f"# in-process limit of {', '.join(models)} (pinned processes, no HTTP{rounds_note})")
    print(format_table(rows, columns))
    return 0


def _traffic(text: str) -> dict[str, float]:
    from onnxpool.measure.tune_models import parse_traffic

    try:
        return parse_traffic(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        help="TOML settings file the servers are started with; with [models.<name>] tables, each model is "
        "measured and the budgets (cpus) for its traffic mix are recommended instead",
    )
    parser.add_argument(
        "--budget", type=_seconds, default=120.0, help="time bound for the whole run, split across models (120s)"
    )
    parser.add_argument(
        "--concurrency", type=positive, help="connections for the HTTP confirmation (default 2 x usable cores)"
    )
    parser.add_argument("--batches", type=_steps, help="batch sizes measured in-process (default 1,4,8)")
    parser.add_argument("--top", type=positive, help="candidates confirmed over HTTP (default 3)")
    parser.add_argument(
        "--traffic",
        type=_traffic,
        metavar="NAME=SHARE,...",
        help="several models: each named model's share of the requests (e.g. image=3,iris=1), instead of its "
        "[models.<name>] traffic",
    )
    parser.add_argument(
        "--write",
        type=Path,
        help="update [server] workers/threads_per_worker in this TOML file (several models: each [models.<name>] cpus)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def tune_command(args: argparse.Namespace) -> int:
    from onnxpool.config.loader import ConfigError, load_settings
    from onnxpool.measure.progress import Progress
    from onnxpool.measure.tune import TuneOptions, format_ranking, run_tune, write_winner

    if args.write is not None and not args.write.is_file():
        return fail(f"--write {args.write}: no such file (tune updates an existing config)")
    try:
        several = bool(load_settings(args.config, pool="").settings.models)
    except ConfigError as exc:
        return fail(str(exc))
    if several:
        return _tune_models_command(args)
    if args.traffic is not None:
        return fail("--traffic: the settings name one model; traffic shares need [models.<name>] tables")
    options = TuneOptions(
        config=Path(args.config) if args.config else None,
        budget=args.budget,
        concurrency=args.concurrency,
        batches=args.batches or (1, 4, 8),
        top=args.top or 3,
    )
    try:
        result = run_tune(options, Progress(enabled=not args.quiet))
    except (ConfigError, RuntimeError, TimeoutError, OSError) as exc:
        return fail(str(exc))
    print(format_ranking(result))
    if result.winner is None:
        return fail("no layout could be confirmed over HTTP within the budget")
    if args.write is not None:
        write_winner(args.write, result)
        print(
            f"wrote [server] workers = {result.winner.workers}, threads_per_worker = {result.winner.threads} "
            f"to {args.write}"
        )
    return 0


def _tune_models_command(args: argparse.Namespace) -> int:
    """`onnxpool tune` on a file with several models: each model per core, the budgets for the mix."""
    from onnxpool.config.loader import ConfigError
    from onnxpool.measure.progress import Progress
    from onnxpool.measure.tune_models import ModelsTuneOptions, format_models, run_tune_models, write_cpus

    for flag, value in (("--concurrency", args.concurrency), ("--batches", args.batches), ("--top", args.top)):
        if value is not None:
            return fail(f"{flag} is for one model's layouts; with several models tune measures each model's budget")
    options = ModelsTuneOptions(
        config=Path(args.config) if args.config else None, budget=args.budget, traffic=args.traffic or {}
    )
    try:
        result = run_tune_models(options, Progress(enabled=not args.quiet))
    except (ConfigError, RuntimeError, TimeoutError, OSError, ValueError) as exc:
        return fail(str(exc))
    print(format_models(result))
    if args.write is not None:
        try:
            write_cpus(args.write, result)
        except (ValueError, OSError) as exc:
            return fail(f"--write {args.write}: {exc}")
        cpus = ", ".join(f"{name} {value:.2f}" for name, value in result.plan.cpus.items())
        print(f"wrote cpus ({cpus}) to {args.write}")
    return 0


def fail(message: str) -> int:
    print(f"onnxpool: error: {message}", file=sys.stderr)
    return 2
