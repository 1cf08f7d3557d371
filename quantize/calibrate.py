"""Step 3, calibration and quantization: onnxruntime's calibrator once, `quantize_static` per candidate.

Calibration runs once; every candidate reuses its ranges (a cache file). The recipe's
identity (target, reduce_range, types, onnxpool version) is written into each model's
`metadata_props` (workers/cpu_fit.py reads it back when the model is served).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from onnxpool.measure.progress import Progress, bar
from onnxpool.quantize.images import FloatArray
from onnxpool.quantize.targets import Recipe, ort_method
from onnxpool.workers.cpu_fit import ModelRecipe


class Reader:
    """onnxruntime CalibrationDataReader over preprocessed arrays, with a progress bar."""

    def __init__(self, input_name: str, images: FloatArray, progress: Progress | None, batch: int = 16) -> None:
        self.input_name, self.images, self.progress, self.batch = input_name, images, progress, batch
        self._it: Iterator[dict[str, FloatArray]] = iter(())
        self.rewind()

    def _batches(self) -> Iterator[dict[str, FloatArray]]:
        n = len(self.images)
        for start in range(0, n, self.batch):
            if self.progress is not None:
                self.progress.status(f"calibrating: {bar(start / n)} {start}/{n} images")
            yield {self.input_name: self.images[start : start + self.batch]}

    def get_next(self) -> dict[str, FloatArray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = self._batches()

    def set_range(self, start_index: int, end_index: int) -> None:  # part of onnxruntime's reader API
        pass


HISTOGRAM_CHUNK = 16  # batches per collect_data call of the histogram calibrators


class _Chunk:
    """At most `size` batches of `reader` per pass (a CalibrationDataReader); more() starts the next pass."""

    def __init__(self, reader: Reader, size: int) -> None:
        self.reader, self.size, self.left = reader, size, 0
        self._peek: dict[str, FloatArray] | None = reader.get_next()

    def more(self) -> bool:
        self.left = self.size
        return self._peek is not None

    def get_next(self) -> dict[str, FloatArray] | None:
        if self.left <= 0 or self._peek is None:
            return None
        self.left -= 1
        out, self._peek = self._peek, self.reader.get_next()
        return out


def calibrate(pre_model: Path, reader: Reader, recipe: Recipe, cache: Path, workdir: Path) -> dict[str, Any]:
    """Run onnxruntime's calibrator once and store its ranges in `cache` (for every candidate).

    `quantize_static` does not pass `num_bins`/`num_quantized_bins` on: with its defaults the
    Entropy calibrator has one candidate threshold (the full range), i.e. it is MinMax. So the
    calibrator is created here, with real bins, and its ranges handed over as a cache.
    Returns {tensor: (low, high)} for the search's ranking.
    """
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorsData, create_calibrator, save_tensors_data

    options: dict[str, Any] = {}
    if recipe.calibrate_method == "MinMaxMean":
        options = {"moving_average": True}
    elif recipe.calibrate_method == "Entropy":
        options = {"num_bins": recipe.num_bins, "num_quantized_bins": recipe.num_quantized_bins}
    elif recipe.calibrate_method == "Percentile":
        options = {"num_bins": recipe.num_bins, "percentile": recipe.percentile, "symmetric": False}
    calibrator = create_calibrator(
        pre_model,
        None,
        augmented_model_path=str(workdir / "augmented.onnx"),
        calibrate_method=getattr(CalibrationMethod, ort_method(recipe.calibrate_method)),
        extra_options=options,
    )
    reader.rewind()
    if recipe.calibrate_method in ("Entropy", "Percentile"):
        # onnxruntime's histogram calibrator keeps every intermediate output of what one
        # collect_data call reads (EfficientNet-Lite0: ~20 MB per image, >12 GB for 608 views)
        # and merges histograms across calls: so it is fed HISTOGRAM_CHUNK batches per call.
        chunk = _Chunk(reader, HISTOGRAM_CHUNK)
        while chunk.more():
            calibrator.collect_data(chunk)
    else:
        calibrator.collect_data(reader)
    ranges = calibrator.compute_data()
    if not isinstance(ranges, TensorsData):
        raise TypeError(f"unexpected calibration result {type(ranges)}")
    save_tensors_data(ranges, cache)
    out: dict[str, Any] = {}
    for name, value in ranges.data.items():
        out[name] = (float(np.min(value.range_value[0])), float(np.max(value.range_value[1])))
    return out


def quantize_with(pre_model: Path, out: Path, recipe: Recipe, reader: Reader, cache: Path, version: str = "") -> Path:
    """`quantize_static` with the recipe and the cached calibration ranges (no re-calibration),
    then the recipe into the model's metadata_props (so it travels with every copy)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    def run(dst: Path, reduce_range: bool) -> None:
        quantize_static(
            model_input=str(pre_model),
            model_output=str(dst),
            calibration_data_reader=reader,
            quant_format=getattr(QuantFormat, recipe.quant_format),
            per_channel=recipe.per_channel,
            reduce_range=reduce_range,
            activation_type=getattr(QuantType, recipe.activation_type),
            weight_type=getattr(QuantType, recipe.weight_type),
            nodes_to_exclude=list(recipe.excluded),
            calibrate_method=getattr(CalibrationMethod, ort_method(recipe.calibrate_method)),
            calibration_cache_path=cache,
        )

    run(out, recipe.reduce_range)
    if recipe.reduce_range and recipe.depthwise_8bit:
        eight = out.with_name(out.stem + ".8bit.onnx")
        run(eight, False)
        model = onnx.load(str(out))
        depthwise_weights_from(model, onnx.load(str(eight)))
        eight.unlink()
        onnx.save(model, str(out))
    return stamp_recipe(out, recipe, version)


def stamp_recipe(out: Path, recipe: Recipe, version: str) -> Path:
    """Write the recipe's `onnxpool.*` keys into the model file's metadata_props (replacing old ones)."""
    import onnx

    model = onnx.load(str(out))
    stamp = recipe_metadata(recipe, version)
    kept = [p for p in model.metadata_props if p.key not in stamp]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in stamp.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(out))
    return out


def depthwise_weights_from(model: Any, source: Any) -> int:
    """Copy into `model` the quantized weights (values, scales, zero points) of its depthwise
    convolutions (group > 1) from `source`, the same graph quantized with other weight bits
    (same activation ranges, same initializer names). Returns how many initializers were copied."""
    producer = {o: n for n in model.graph.node for o in n.output}
    names: set[str] = set()
    for node in model.graph.node:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if node.op_type != "Conv" or group <= 1:
            continue
        # the weights and the int32 bias, whose scale is input scale x weight scale: a bias left
        # at the other weights' scale stops onnxruntime fusing the node into QLinearConv
        for dq in (producer.get(name) for name in node.input[1:3]):
            if dq is not None and dq.op_type == "DequantizeLinear":
                names.update(dq.input)
    others = {i.name: i for i in source.graph.initializer}
    copied = 0
    for init in model.graph.initializer:
        if init.name in names and init.name in others:
            init.CopyFrom(others[init.name])
            copied += 1
    return copied


def recipe_metadata(recipe: Recipe, version: str) -> dict[str, str]:
    """The `onnxpool.*` keys the server reads back (workers/cpu_fit.py)."""
    return ModelRecipe(
        target=recipe.target,
        reduce_range=recipe.reduce_range,
        activation_type=recipe.activation_type,
        weight_type=recipe.weight_type,
        version=version,
    ).to_metadata()
