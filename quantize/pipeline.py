"""`onnxpool quantize MODEL --calibration DIR -o OUT.onnx [--target T]`: static INT8, measured.

The steps, each in its own module of this package:

1. `images`: every file of a folder through the server's OWN preprocessing.
2. `targets`: the recipe of the target (portable, avx2, avx512-vnni, host) and, for each
   family of int8 kernels the target must be right on, how it is judged here: natively, under
   qemu's user-mode emulator, or not at all (then reported as *not evaluated*, never as passed).
3. `calibrate`: onnxruntime's calibrator once; `quantize_static` per candidate, reusing its
   ranges; the recipe stamped into the model's metadata_props.
4. `evaluate`: each candidate vs the FP32 model (run natively on this host) on the held-out
   images, with every evaluated kernel family of the target; the worst family counts. FP32
   with itself under +-0.5 grey-level noise is the floor of those numbers.
5. `search`: the fewest float layers that meet the budget (a contiguous prefix first).
   A candidate that misses the budget natively is not emulated (emulation is minutes).
6. `speed`: FP32 and INT8 on the host, pinned, alternating rounds.
7. `report`: the model and `OUT.quantize.json`, written only when a candidate met the budget.

onnxruntime's `WeightBiasQuantization` optimizer would re-quantize the float layers when a
session loads; `workers.session.build_session`, used here, under emulation and by the server,
disables it.
"""

from __future__ import annotations

import platform
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from onnxpool.config.settings import LimitsSettings
from onnxpool.measure.progress import Progress
from onnxpool.quantize.calibrate import Reader, calibrate, quantize_with
from onnxpool.quantize.emulate import emulated_logits
from onnxpool.quantize.errors import QuantizeError
from onnxpool.quantize.evaluate import Accuracy, compare_logits, grey_level_noise, run_logits
from onnxpool.quantize.graph import float_input, name_nodes, quantizable_nodes, rank_by_range, with_activations
from onnxpool.quantize.images import load_images
from onnxpool.quantize.report import cpu_description, versions, write_outputs
from onnxpool.quantize.search import search_exclusions
from onnxpool.quantize.speed import compare_speed
from onnxpool.quantize.targets import (
    HOST,
    MINMAX_BATCH,
    CalibMethod,
    Judge,
    choose_recipe,
    find_qemu,
    plan_judges,
)
from onnxpool.tasks.image.imaging import ImagePipeline
from onnxpool.tasks.image.settings import PreprocessSettings
from onnxpool.workers.cpu_fit import cpu_flags


@dataclass(frozen=True)
class QuantizeOptions:
    model: Path
    calibration: Path
    output: Path
    preprocess: PreprocessSettings
    limits: LimitsSettings
    class_names: tuple[str, ...] = ()
    eval: Path | None = None
    eval_labels: Path | None = None
    max_disagreement: float = 0.03
    max_kl: float | None = None
    gate: str = "all"
    decisive_margin: float = 0.1
    calibrate_method: CalibMethod = "MinMax"
    views: int = 1
    """Views per calibration photo (the photo, its mirror, seeded random crops)."""
    eval_views: int = 1
    """Views per held-out photo; 1 = each photo as the server would see it uploaded."""
    max_float: int = 12
    exclude: tuple[str, ...] = ()
    speed_seconds: float = 3.0
    speed_rounds: int = 3
    config_file: str | None = None
    target: str = "portable"
    depthwise_8bit: bool | None = None


def _check_inputs(opts: QuantizeOptions) -> None:
    if not opts.model.is_file():
        raise QuantizeError(f"model file {opts.model} does not exist")
    if opts.preprocess.dtype != "float32":
        raise QuantizeError(f"[task.preprocess] dtype is {opts.preprocess.dtype}; quantize needs a float32 input")
    if not opts.output.parent.is_dir():
        raise QuantizeError(f"output folder {opts.output.parent} does not exist")


def run_quantize(opts: QuantizeOptions, progress: Progress) -> dict[str, Any]:
    """The whole command; raises QuantizeError for what the operator can fix. Returns the report."""
    from onnxpool import __version__
    from onnxpool.workers.cores import usable_cores
    from onnxpool.workers.session import DISABLED_OPTIMIZERS, build_session

    _check_inputs(opts)
    flags = cpu_flags()
    recipe = choose_recipe(opts.target, flags, opts.calibrate_method)
    if opts.depthwise_8bit is not None:  # None: the target's recipe decides
        recipe = replace(recipe, depthwise_8bit=opts.depthwise_8bit and recipe.reduce_range)
    # Before any image is read: an unknown target or a missing qemu is one line, now.
    judges = plan_judges(opts.target, flags, qemu=find_qemu())
    evaluated = [j for j in judges if j.evaluated]
    # No family of the target can run here: the search still needs a judge. It uses this
    # host's kernels, and the report says the target itself was NOT evaluated.
    search_judges = sorted(evaluated, key=lambda j: j.how != "native") or [Judge(HOST, "native")]
    pipeline = ImagePipeline(opts.preprocess, opts.limits)
    input_name = float_input(opts.model, pipeline.input_shape)
    calib = load_images(opts.calibration, pipeline, "calibration", opts.views, progress)
    held_out = (
        load_images(opts.eval, pipeline, "eval", opts.eval_views, progress, opts.eval_labels, opts.class_names)
        if opts.eval is not None
        else None
    )
    threads = len(usable_cores())
    with tempfile.TemporaryDirectory(prefix="onnxpool-quantize-") as tmp:
        work = Path(tmp)
        named = name_nodes(opts.model, work / "named.onnx")
        pre = work / "pre.onnx"
        from onnxruntime.quantization.shape_inference import quant_pre_process

        progress.status("pre-processing the model (shape inference, constant folding)", force=True)
        # Symbolic shape inference (needs sympy) is skipped: ONNX's own inference covers image CNNs.
        quant_pre_process(str(named), str(pre), skip_symbolic_shape=True)
        candidates = quantizable_nodes(pre)
        unknown = [n for n in opts.exclude if n not in candidates]
        if unknown:
            raise QuantizeError(f"--exclude {unknown[0]!r}: no Conv/Gemm/MatMul node of that name")
        # onnxruntime's histogram collector (Percentile, Entropy) fails on a last batch smaller
        # than the others: feed those one image at a time.
        batch = MINMAX_BATCH if recipe.calibrate_method in ("MinMax", "MinMaxMean") else 1
        reader = Reader(input_name, calib.arrays, progress, batch)
        cache = work / "ranges.json"
        t0 = time.perf_counter()
        ranges = calibrate(pre, reader, recipe, cache, work)
        calibration_seconds = time.perf_counter() - t0
        progress.done(
            f"calibrated ({recipe.calibrate_method}) on {len(calib.names)} images in {calibration_seconds:.1f}s"
        )
        judge_set = held_out if held_out is not None else calib
        fp32 = build_session(pre, threads)
        ref = run_logits(fp32, judge_set.arrays, progress, "FP32 reference")
        noisy = grey_level_noise(judge_set.arrays, opts.preprocess)
        floor = compare_logits(ref, run_logits(fp32, noisy), judge_set.labels, opts.decisive_margin)
        del fp32, noisy
        progress.done(
            f"FP32 vs FP32 with +-0.5 grey-level noise: top-1 agreement {floor.top1_agreement:.3f}, "
            f"decisive {floor.decisive_agreement:.3f} (the noise floor of these images)"
        )
        emulated = [j for j in search_judges if j.how == "qemu"]
        if emulated:
            progress.done(
                f"each candidate that meets the budget natively is also judged under emulation "
                f"({', '.join(j.describe() for j in emulated)}): ~1-2 s per image and process, "
                f"{len(judge_set.names)} images on {threads} processes"
            )

        def meets(acc: Accuracy) -> bool:
            return acc.disagreement(opts.gate) <= opts.max_disagreement and (
                opts.max_kl is None or acc.mean_kl <= opts.max_kl
            )

        def score(acc: Accuracy) -> tuple[float, float]:
            return (acc.disagreement(opts.gate), acc.mean_kl)

        per_candidate: dict[tuple[str, ...], dict[str, Accuracy]] = {}
        count = 0

        def judge(j: Judge, model: Path) -> Accuracy:
            if j.how == "qemu":
                logits = emulated_logits(
                    j.command, model, input_name, judge_set.arrays, threads, progress.status, f"{j.kernels.name} (qemu)"
                )
            else:
                logits = run_logits(build_session(model, threads), judge_set.arrays)
            return compare_logits(ref, logits, judge_set.labels, opts.decisive_margin)

        def evaluate(excluded: Sequence[str]) -> Accuracy:
            nonlocal count
            count += 1
            nodes = with_activations(pre, [*opts.exclude, *excluded])
            n_float = len(excluded) + len(opts.exclude)
            progress.status(f"candidate {count}: {n_float} float layers", force=True)
            out = quantize_with(pre, work / "candidate.onnx", recipe.with_excluded(nodes), reader, cache, __version__)
            accs: dict[str, Accuracy] = {}
            for j in search_judges:  # native first: a candidate that fails there is not emulated
                acc = accs[j.kernels.name] = judge(j, out)
                progress.done(
                    f"candidate {count}: {n_float} float layers, {j.describe()}: top-1 agreement "
                    f"{acc.top1_agreement:.3f}, decisive {acc.decisive_agreement:.3f}, KL {acc.mean_kl:.4f}"
                )
                if not meets(acc):
                    break
            per_candidate[tuple(sorted(excluded))] = accs
            return max(accs.values(), key=score)

        searchable = [c for c in candidates if c not in opts.exclude]
        search = search_exclusions(
            searchable,
            rank_by_range(pre, searchable, ranges),
            evaluate,
            opts.max_disagreement,
            opts.gate,
            opts.max_float,
            max_kl=opts.max_kl,
        )
        if not search.met:
            raise QuantizeError(
                f"no candidate met --max-disagreement {opts.max_disagreement} ({opts.gate} images)"
                f"{'' if opts.max_kl is None else f' and --max-kl {opts.max_kl}'} with up to {opts.max_float} "
                f"float layers on {', '.join(j.kernels.name for j in search_judges)} kernels; best reached: "
                f"{search.best_disagreement:.4f} disagreement (mean KL {search.best_mean_kl:.4f}) with "
                f"{len(search.best)} float layers (FP32 itself under +-0.5 grey-level noise: "
                f"{floor.disagreement(opts.gate):.4f}); nothing written"
            )
        final_nodes = with_activations(pre, [*opts.exclude, *search.best])
        final_recipe = recipe.with_excluded(final_nodes)
        final = quantize_with(pre, work / "final.onnx", final_recipe, reader, cache, __version__)
        # The met candidate was judged by every judge (none failed, so none was skipped): the
        # same recipe and ranges give the same file, so its numbers are the final model's.
        final_accs = per_candidate[tuple(sorted(search.best))]
        accuracy = max(final_accs.values(), key=score)
        speed = None
        if opts.speed_seconds > 0 and opts.speed_rounds > 0:
            speed = compare_speed({"fp32": pre, "int8": final}, opts.speed_seconds, opts.speed_rounds, progress)
            progress.done(f"speed ({speed['layout']}, pinned): INT8 {speed['speedup']['int8']:.2f}x FP32")
        report: dict[str, Any] = {
            "model": str(opts.model),
            "output": str(opts.output),
            "versions": versions(),
            "python": platform.python_version(),
            "cpu": cpu_description(flags, threads),
            "config_file": opts.config_file,
            "preprocess": opts.preprocess.model_dump(mode="json"),
            "target": opts.target,
            "recipe": {
                **asdict(final_recipe),
                "pre_process": "quant_pre_process (ONNX shape inference + onnxruntime basic optimisation)",
                "disabled_optimizers": list(DISABLED_OPTIMIZERS),
                "reduce_range_reason": (
                    "7-bit weights: u8 x s8 pairs cannot saturate int16 on AVX2 kernels (vpmaddubsw)"
                    if final_recipe.reduce_range
                    else "8-bit weights: exact on VNNI/arm64 kernels only"
                ),
                "metadata_props": "onnxpool.target, reduce_range, activation_type, weight_type, version",
            },
            "targets": _target_report(judges, final_accs, search_judges),
            "float_layers": list(search.best) + list(opts.exclude),
            "calibration": {**calib.describe(), "views_per_file": opts.views, "seconds": round(calibration_seconds, 2)},
            "eval": None if held_out is None else {**held_out.describe(), "views_per_file": opts.eval_views},
            "judged_on": "eval" if held_out is not None else "calibration (no --eval: not held out)",
            "reference": "the FP32 model run natively on this host",
            "budget": {
                "max_disagreement": opts.max_disagreement,
                "gate": opts.gate,
                "decisive_margin": opts.decisive_margin,
                "max_kl": opts.max_kl,
                "met": True,
                "met_on": [j.describe() for j in search_judges],
            },
            "selection_note": "the search chose among candidates on the images it is judged on, so the final "
            "agreement is optimistic by about the noise of a few images",
            "accuracy": asdict(accuracy),
            "fp32_noise_floor": {"noise_grey_levels": 0.5, **asdict(floor)},
            "search": {
                "candidates": len(candidates),
                "evaluated": len(search.trials),
                "trials": [asdict(t) for t in search.trials],
            },
            "speed": speed,
            "sizes_bytes": {"fp32": opts.model.stat().st_size, "int8": final.stat().st_size},
        }
        write_outputs(opts.output, final, report)
    return report


def _target_report(
    judges: Sequence[Judge], accs: dict[str, Accuracy], search_judges: Sequence[Judge]
) -> dict[str, dict[str, Any]]:
    """Per kernel family of the target: how it was judged and its numbers, or why it was not."""
    out: dict[str, dict[str, Any]] = {}
    for j in judges:
        acc = accs.get(j.kernels.name)
        out[j.kernels.name] = {
            "kernels": j.kernels.description,
            "judged": j.how,
            "command": " ".join(j.command) or None,
            "reason": j.reason or None,
            "accuracy": None if acc is None or not j.evaluated else asdict(acc),
        }
    if not any(j.evaluated for j in judges):
        proxy = search_judges[0]
        out["search_proxy"] = {
            "kernels": proxy.kernels.description,
            "judged": "native",
            "command": None,
            "reason": "no kernel family of the target runs here: the search was judged on this host's "
            "kernels, which are not the target's; the target is NOT evaluated",
            "accuracy": asdict(accs[proxy.kernels.name]),
        }
    return out


def unevaluated(report: dict[str, Any]) -> list[str]:
    """Kernel families of the report's target that were not evaluated (with the reason)."""
    return [
        f"{name}: {entry['reason']}" for name, entry in report["targets"].items() if entry["judged"] == "not evaluated"
    ]
