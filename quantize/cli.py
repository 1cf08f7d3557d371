"""Arguments and entry point of `onnxpool quantize` (registered by `onnxpool.cli`).

The pipeline (onnx, onnxruntime's quantization tools) loads only when the command runs.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from onnxpool.measure.cli import fail, fraction, positive


def add_quantize_arguments(parser: argparse.ArgumentParser) -> None:
    from onnxpool.quantize.targets import CALIB_METHODS, TARGETS

    parser.add_argument("model", nargs="?", type=Path, help="float ONNX file (default: [model].path of the config)")
    parser.add_argument(
        "--calibration",
        type=Path,
        help="image models: folder of calibration images (required); text-embedding models: sentences the "
        "search chooses on (a JSON array of strings, or one per line; default: the --eval ones)",
    )
    parser.add_argument("-o", "--output", type=Path, required=True, help="the INT8 .onnx file to write")
    parser.add_argument(
        "--target",
        default="portable",
        metavar="{" + ",".join(TARGETS) + "}",
        help="CPUs the model must be right on, and whose int8 kernels judge it: portable (default: AVX2 and "
        "AVX512-VNNI x86, arm64 if it can be run), avx2, avx512-vnni, host; kernels this CPU does not use "
        "are judged under qemu-x86_64 (apt-get install qemu-user) where qemu can emulate them",
    )
    parser.add_argument(
        "--eval",
        type=Path,
        help="held-out images (a folder; class subfolders = labels), or for a text-embedding model held-out "
        "sentences (required: a JSON array of strings, or one per line)",
    )
    parser.add_argument(
        "--min-cosine",
        type=fraction,
        default=0.99,
        help="text-embedding models: the least mean cosine of INT8 to FP32 embeddings (default 0.99)",
    )
    parser.add_argument("--eval-labels", type=Path, help="labels file for --eval: 'file<TAB>class' per line")
    parser.add_argument(
        "--max-disagreement",
        type=fraction,
        default=0.03,
        help="largest share of images whose top-1 differs from FP32's (default 0.03)",
    )
    parser.add_argument(
        "--gate",
        choices=("all", "decisive"),
        default="all",
        help="apply --max-disagreement to all images (default) or only where FP32's top-1 leads by --decisive-margin",
    )
    parser.add_argument("--max-kl", type=float, help="also require mean KL(FP32 || INT8) <= this (default: none)")
    parser.add_argument("--decisive-margin", type=fraction, default=0.1, help="softmax top-1 minus top-2 (0.1)")
    parser.add_argument(
        "--method",
        choices=CALIB_METHODS,
        default="MinMax",
        help="calibration: MinMax (extremes of all images), MinMaxMean (mean of per-batch extremes), "
        "Entropy, Percentile",
    )
    parser.add_argument(
        "--views", type=positive, default=1, help="per calibration photo: itself, its mirror, random crops (1)"
    )
    parser.add_argument(
        "--eval-views", type=positive, default=1, help="the same per held-out photo (1: each photo as uploaded)"
    )
    parser.add_argument("--max-float", type=int, default=12, help="most layers the search may keep float (12)")
    parser.add_argument(
        "--depthwise-8bit",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with 7-bit weights (portable, avx2): 8-bit weights in depthwise convolutions, whose int8 kernels "
        "sum in int32 on every x86 CPU (default: on wherever weights are 7-bit)",
    )
    parser.add_argument("--exclude", action="append", default=[], metavar="NODE", help="keep this node float too")
    parser.add_argument("--speed-seconds", type=float, default=3.0, help="per model and round; 0 = no speed (3)")
    parser.add_argument("--speed-rounds", type=int, default=3, help="alternating FP32/INT8 rounds (default 3)")
    parser.add_argument("--config", help="TOML settings file: [task.preprocess] and [limits] used for the images")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def quantize_command(args: argparse.Namespace) -> int:
    from onnxpool.config.loader import ConfigError, load_settings
    from onnxpool.measure.progress import Progress

    try:
        loaded = load_settings(args.config)
    except ConfigError as exc:
        return fail(str(exc))
    settings = loaded.settings
    try:
        from onnxpool.quantize.pipeline import QuantizeOptions, run_quantize, unevaluated
        from onnxpool.quantize.report import report_path
    except ImportError as exc:
        return fail(f"quantize needs the onnx package ({exc.name} is missing): pip install 'onnxpool[quantize]'")
    if settings.model.task == "text-embedding":
        return _quantize_text(args, settings)
    if settings.model.task.startswith("text-"):
        return fail(
            f"quantize makes image-classification and text-embedding models; [model] task is {settings.model.task!r}"
        )
    if args.calibration is None:
        return fail("--calibration DIR (a folder of calibration images) is required for an image model")
    from onnxpool.tasks.image.settings import image_settings
    from onnxpool.tasks.image.task import labels_file

    try:
        image = image_settings(loaded)
    except ConfigError as exc:
        return fail(str(exc))
    labels: tuple[str, ...] = ()
    names = labels_file(image.labels, Path(settings.model.path))
    if names is not None and names.is_file():
        labels = tuple(names.read_text(encoding="utf-8").splitlines())
    options = QuantizeOptions(
        model=args.model or Path(settings.model.path),
        calibration=args.calibration,
        output=args.output,
        preprocess=image.preprocess,
        limits=settings.limits,
        class_names=labels,
        eval=args.eval,
        eval_labels=args.eval_labels,
        max_disagreement=args.max_disagreement,
        max_kl=args.max_kl,
        gate=args.gate,
        decisive_margin=args.decisive_margin,
        calibrate_method=args.method,
        views=args.views,
        eval_views=args.eval_views,
        max_float=args.max_float,
        exclude=tuple(args.exclude),
        speed_seconds=args.speed_seconds,
        speed_rounds=args.speed_rounds,
        config_file=args.config,
        target=args.target,
        depthwise_8bit=args.depthwise_8bit,
    )
    report = _run(lambda: run_quantize(options, Progress(enabled=not args.quiet)))
    if isinstance(report, int):
        return report
    acc = report["accuracy"]
    print(f"wrote {args.output} and {report_path(args.output)}")
    print(f"target {report['target']}; float layers {len(report['float_layers'])}; judged on {report['judged_on']}:")
    _print_targets(
        report,
        "accuracy",
        lambda a: (
            f"top-1 agreement {a['top1_agreement']:.3f} (decisive {a['decisive_agreement']:.3f} of "
            f"{a['decisive_n']}), top-5 overlap {a['top5_overlap']:.3f}, mean KL {a['mean_kl']:.4f}"
        ),
    )
    missing = unevaluated(report)
    if missing:
        print(f"not evaluated here, so not known to be right there: {'; '.join(missing)}")
    if acc["labelled"]:
        print(
            f"labelled {acc['labelled']}: top-1 FP32 {acc['fp32_top1_accuracy']:.3f} INT8 "
            f"{acc['int8_top1_accuracy']:.3f}; top-5 FP32 {acc['fp32_top5_accuracy']:.3f} "
            f"INT8 {acc['int8_top5_accuracy']:.3f}"
        )
    _print_speed(report)
    return 0


def _run(run: Callable[[], dict[str, Any]]) -> dict[str, Any] | int:
    """The report of `run()`, or `fail`'s exit code for a QuantizeError.

    SIGTERM unwinds like Ctrl-C while it runs, so the temporary models (tens of MB) are removed too.
    """
    from onnxpool.quantize.errors import QuantizeError

    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return run()
    except QuantizeError as exc:
        return fail(str(exc))
    finally:
        signal.signal(signal.SIGTERM, previous)


def _print_targets(report: dict[str, Any], key: str, numbers: Callable[[dict[str, Any]], str]) -> None:
    """One line per kernel family of the target: how it was judged and `numbers(report entry's key)`."""
    for name, entry in report["targets"].items():
        result = entry[key]
        if result is None:
            print(f"  {name}: NOT EVALUATED ({entry['reason']})")
            continue
        print(f"  {name} ({entry['judged']}{', ' + entry['command'] if entry['command'] else ''}): {numbers(result)}")


def _print_speed(report: dict[str, Any]) -> None:
    if report["speed"] is not None:
        print(f"speed: INT8 {report['speed']['speedup']['int8']:.2f}x FP32 ({report['speed']['layout']}, pinned)")


def _quantize_text(args: argparse.Namespace, settings: Any) -> int:
    """A text-embedding model ([model] task of the --config): dynamic INT8, judged by cosine."""
    from onnxpool.config.loader import ConfigError, load_settings
    from onnxpool.measure.progress import Progress
    from onnxpool.quantize.report import report_path
    from onnxpool.quantize.text import TextQuantizeOptions, run_quantize_text

    if args.eval is None:
        return fail("--eval FILE (held-out sentences: a JSON array of strings, or one per line) is required")
    try:  # the served settings, with every sentence judged (cut to the model's limit as the server cuts it)
        served = load_settings(args.config, overrides={"task.truncate": True})
    except ConfigError as exc:
        return fail(str(exc))
    options = TextQuantizeOptions(
        model=args.model or Path(settings.model.path),
        output=args.output,
        settings=served,
        eval=args.eval,
        search=args.calibration,
        min_cosine=args.min_cosine,
        max_float=args.max_float,
        exclude=tuple(args.exclude),
        speed_seconds=args.speed_seconds,
        speed_rounds=args.speed_rounds,
        config_file=args.config,
        target=args.target,
    )
    report = _run(lambda: run_quantize_text(options, Progress(enabled=not args.quiet)))
    if isinstance(report, int):
        return report
    print(f"wrote {args.output} and {report_path(args.output)}")
    print(
        f"target {report['target']}; float MatMuls {len(report['float_layers'])}; {report['sentences']['judged_on']}:"
    )
    _print_targets(
        report,
        "similarity",
        lambda sim: (
            f"mean cosine {sim['mean_cosine']:.4f} (min {sim['min_cosine']:.4f}) on {sim['n']} sentences, "
            f"top-10 retrieval overlap {sim['retrieval_top10_overlap']:.3f}"
        ),
    )
    _print_speed(report)
    return 0
