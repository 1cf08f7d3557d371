"""`onnxpool quantize MODEL --calibration DIR -o OUT.onnx`: static INT8 that is measured, not hoped for.

The steps, each in one function below:

1. Images: every file of a folder goes through the server's OWN preprocessing
   (`onnxpool.tasks.image.imaging.ImagePipeline`, `[model.preprocess]` of the active settings), so
   the INT8 model is calibrated and judged on exactly what it will see in production.
   Files that are not images are skipped and counted. `views` > 1 adds the mirror and
   random crops of each photo (seeded by its name, so runs repeat).
2. Recipe for THIS CPU (`choose_recipe`): onnxruntime static quantization, QDQ format,
   U8 activations, S8 per-channel weights. `reduce_range` (7-bit weights) only on x86
   without an int8 dot-product instruction (VNNI): there, u8 x s8 pairs can saturate
   int16; with VNNI they cannot and 7 bits only cost accuracy.
3. Accuracy guard (`search_exclusions`): each candidate is compared with the FP32 model on
   the held-out images (and FP32 with itself under +-0.5 grey-level noise, the floor of
   those numbers). Layers are kept in float until the budget holds, with the fewest float
   layers: first a contiguous prefix (one float->INT8 boundary, cheap in speed), trimmed
   from its start while the budget holds; only if no prefix meets it, a greedy forward
   pass over the layers with the widest calibrated output range, then a backward pass.
   Calibration runs once; candidates reuse its ranges.
4. Speed (`compare_speed`): FP32 and INT8 with `measure.limit`'s pinned, spawned processes,
   same layout, alternating rounds in one run.
5. Output: the model and `OUT.quantize.json` (versions, CPU flags, settings, image set
   digests, excluded layers, every number), written only when a candidate met the budget,
   each through a temporary file and a rename, so nothing half-written is left.

onnxruntime's `WeightBiasQuantization` optimizer would re-quantize the float layers when a
session loads; `workers.session.build_session`, used here and by the server, disables it.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from onnxpool.config.settings import LimitsSettings, PreprocessSettings
from onnxpool.measure.progress import Progress, bar
from onnxpool.tasks.errors import OnnxpoolError
from onnxpool.tasks.image.imaging import ImagePipeline

FloatArray = npt.NDArray[np.float32]
CalibMethod = Literal["MinMax", "MinMaxMean", "Entropy", "Percentile"]
CALIB_METHODS: tuple[CalibMethod, ...] = ("MinMax", "MinMaxMean", "Entropy", "Percentile")
# MinMaxMean: each tensor's range is the MEAN over calibration batches of the batch's min and
# max (onnxruntime's MinMax calibrator with moving_average), not the extreme of all images, so
# one outlier photo does not widen a range for all; a few values are clipped instead.
MINMAX_BATCH = 16  # images per calibration batch for the MinMax methods (MinMaxMean averages over these)


def ort_method(method: CalibMethod) -> str:
    """onnxruntime's CalibrationMethod name for one of ours."""
    return "MinMax" if method == "MinMaxMean" else method


GATES = ("all", "decisive")


class QuantizeError(ValueError):
    """Bad input or an unmet budget: one line for the operator, non-zero exit."""


# -- CPU ----------------------------------------------------------------------------------------


def parse_cpu_flags(cpuinfo_text: str) -> frozenset[str]:
    """Flags of the first processor in a /proc/cpuinfo dump."""
    for line in cpuinfo_text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        return parse_cpu_flags(cpuinfo.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return frozenset()


def has_vnni(flags: frozenset[str]) -> bool:
    """An int8 dot-product instruction: AVX512-VNNI, AVX-VNNI or AMX-INT8."""
    return bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def choose_reduce_range(flags: frozenset[str], machine: str | None = None) -> bool:
    """7-bit weights only on x86 without VNNI (u8 x s8 via vpmaddubsw saturates int16 there)."""
    arch = (machine or platform.machine()).lower()
    return arch in ("x86_64", "amd64", "i386", "i686") and not has_vnni(flags)


@dataclass(frozen=True)
class Recipe:
    """Everything besides the images that decides the INT8 model."""

    calibrate_method: CalibMethod = "MinMax"
    reduce_range: bool = False
    per_channel: bool = True
    quant_format: str = "QDQ"
    activation_type: str = "QUInt8"
    weight_type: str = "QInt8"
    percentile: float = 99.999
    num_bins: int = 2048
    num_quantized_bins: int = 256
    excluded: tuple[str, ...] = ()

    def with_excluded(self, nodes: Sequence[str]) -> Recipe:
        return replace(self, excluded=tuple(nodes))


def choose_recipe(flags: frozenset[str], method: CalibMethod = "MinMax") -> Recipe:
    return Recipe(calibrate_method=method, reduce_range=choose_reduce_range(flags))


# -- images -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageSet:
    """Preprocessed images of one folder, with what was skipped and a digest of the files."""

    folder: Path
    arrays: FloatArray
    names: tuple[str, ...]
    files: int
    skipped: int
    digest: str
    labels: tuple[int, ...] | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "folder": str(self.folder),
            "files": self.files,
            "skipped_not_images": self.skipped,
            "images": len(self.names),
            "sha256": self.digest,
            "labelled": self.labels is not None,
        }


def list_files(folder: Path, what: str) -> list[Path]:
    """Every regular, non-hidden file below `folder`, sorted; QuantizeError if none or unreadable."""
    if not folder.exists():
        raise QuantizeError(f"{what} folder {folder} does not exist")
    if not folder.is_dir():
        raise QuantizeError(f"{what} folder {folder} is not a folder")
    if not os.access(folder, os.R_OK | os.X_OK):
        raise QuantizeError(f"{what} folder {folder} cannot be read: permission denied")
    try:
        files = sorted(
            p
            for p in folder.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
        )
    except OSError as exc:
        raise QuantizeError(f"{what} folder {folder} cannot be read: {exc.strerror or exc}") from None
    if not files:
        raise QuantizeError(f"{what} folder {folder} is empty")
    return files


def views(data: bytes, n: int, seed_key: str) -> list[bytes]:
    """The photo, then its mirror, then n-2 random crops (35-90 % of the area, aspect 3:4..4:3,
    random flip), seeded by `seed_key`; each encoded as PNG so it is preprocessed like an upload."""
    from PIL import Image, ImageOps

    out = [data]
    if n <= 1:
        return out
    im = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    rng = np.random.default_rng(int(hashlib.sha256(seed_key.encode()).hexdigest()[:8], 16))

    def png(x: Image.Image) -> bytes:
        buffer = io.BytesIO()
        x.save(buffer, "PNG")
        return buffer.getvalue()

    out.append(png(ImageOps.mirror(im)))
    width, height = im.size
    attempts = 0
    while len(out) < n and attempts < 100 * n:
        attempts += 1
        area = rng.uniform(0.35, 0.9) * width * height
        aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
        cw, ch = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if cw > width or ch > height or min(cw, ch) < 16:
            continue
        x0, y0 = int(rng.integers(0, width - cw + 1)), int(rng.integers(0, height - ch + 1))
        crop = im.crop((x0, y0, x0 + cw, y0 + ch))
        out.append(png(ImageOps.mirror(crop) if rng.random() < 0.5 else crop))
    return out


def read_label_file(path: Path) -> dict[str, str]:
    """`file<TAB or comma>class` per line (file relative to the eval folder); # comments."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise QuantizeError(f"labels file {path} cannot be read: {exc}") from None
    out: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        sep = "\t" if "\t" in line else ","
        name, _, label = line.partition(sep)
        if not label.strip():
            raise QuantizeError(f"labels file {path} line {number}: expected 'file<TAB>class'")
        out[name.strip()] = label.strip()
    return out


def class_index(label: str, class_names: Sequence[str]) -> int:
    """A class given by name (as in the model's labels file, case-insensitive) or by index."""
    lowered = [c.lower() for c in class_names]
    if label.lower() in lowered:
        return lowered.index(label.lower())
    if label.isdigit() and (not class_names or int(label) < len(class_names)):
        return int(label)
    raise QuantizeError(f"class {label!r} is neither a class name of the model's labels nor an index")


def load_images(
    folder: Path,
    pipeline: ImagePipeline,
    what: str,
    n_views: int = 1,
    progress: Progress | None = None,
    label_file: Path | None = None,
    class_names: Sequence[str] = (),
) -> ImageSet:
    """Preprocess every image of `folder` (and `n_views` views of each) with the server's pipeline.

    Labels: from `label_file`, else from class folders when every image sits in a subfolder.
    """
    files = list_files(folder, what)
    digest = hashlib.sha256()
    arrays: list[FloatArray] = []
    names: list[str] = []
    owners: list[Path] = []
    skipped = 0
    for i, path in enumerate(files):
        if progress is not None:
            progress.status(f"{what}: {bar(i / len(files))} {i}/{len(files)} files")
        rel = path.relative_to(folder).as_posix()
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise QuantizeError(f"{what} file {path} cannot be read: {exc.strerror or exc}") from None
        try:
            first = pipeline.preprocess_batch([data], [rel])
        except OnnxpoolError:
            skipped += 1
            continue
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
        arrays.append(np.array(first[0], dtype=np.float32))
        names.append(rel)
        owners.append(path)
        for k, view in enumerate(views(data, n_views, rel)[1:], 1):
            arrays.append(np.array(pipeline.preprocess_batch([view], [rel])[0], dtype=np.float32))
            names.append(f"{rel}#{k}")
            owners.append(path)
    if not arrays:
        raise QuantizeError(f"{what} folder {folder} has no readable image ({skipped} files skipped: not images)")
    if progress is not None:
        progress.done(f"{what}: {len(owners)} images from {len(files) - skipped} files ({skipped} skipped)")
    labels = _labels_for(folder, owners, label_file, class_names, what)
    return ImageSet(folder, np.stack(arrays), tuple(names), len(files), skipped, digest.hexdigest(), labels)


def _labels_for(
    folder: Path, owners: Sequence[Path], label_file: Path | None, class_names: Sequence[str], what: str
) -> tuple[int, ...] | None:
    if label_file is not None:
        table = read_label_file(label_file)
        out = []
        for path in owners:
            rel = path.relative_to(folder).as_posix()
            label = table.get(rel, table.get(path.name))
            out.append(-1 if label is None else class_index(label, class_names))
        return tuple(out)
    parents = {path.relative_to(folder).parent for path in owners}
    if any(p == Path(".") for p in parents) or not all(len(p.parts) == 1 for p in parents):
        return None
    return tuple(class_index(path.parent.name, class_names) for path in owners)


# -- model --------------------------------------------------------------------------------------


def float_input(model_path: Path, image_shape: Sequence[int] | None = None) -> str:
    """The name of the model's one float32 input; QuantizeError otherwise, or if its static
    dimensions do not fit `image_shape` (one preprocessed image, without the batch axis)."""
    import onnx

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and others for a file that is not a model
        raise QuantizeError(f"model file {model_path} is not an ONNX model: {str(exc).splitlines()[0]}") from None
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    floats = [i for i in inputs if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT]
    if len(inputs) != 1 or not floats:
        kinds = ", ".join(f"{i.name}: {onnx.TensorProto.DataType.Name(i.type.tensor_type.elem_type)}" for i in inputs)
        raise QuantizeError(f"model {model_path} needs exactly one float32 input to quantize; it has {kinds or 'none'}")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in floats[0].type.tensor_type.shape.dim]
    if image_shape is not None and (
        len(dims) != len(image_shape) + 1
        or any(d is not None and d != want for d, want in zip(dims[1:], image_shape, strict=True))
    ):
        shown = ", ".join("?" if d is None else str(d) for d in dims)
        raise QuantizeError(
            f"model input {floats[0].name!r} is [{shown}] but [model.preprocess] makes images of "
            f"{list(image_shape)}: pass the model's settings with --config"
        )
    return str(floats[0].name)


def quantizable_nodes(model_path: Path) -> list[str]:
    """Conv/Gemm/MatMul nodes in graph order: what the search may keep in float."""
    import onnx

    model = onnx.load(str(model_path))
    return [n.name for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]


def with_activations(model_path: Path, nodes: Sequence[str]) -> tuple[str, ...]:
    """`nodes` plus the Clip/Relu that is the sole consumer of each: left quantized, its QDQ pair
    would sit on the un-clipped output, whose range is far wider than the clipped one."""
    import onnx

    model = onnx.load(str(model_path))
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    by_name = {n.name: n for n in model.graph.node}
    out = list(dict.fromkeys(nodes))
    for name in list(out):
        for output in by_name[name].output:
            users = consumers.get(output, [])
            if len(users) == 1 and users[0].op_type in ("Clip", "Relu") and users[0].name not in out:
                out.append(users[0].name)
    return tuple(out)


def name_nodes(src: Path, dst: Path) -> Path:
    """A copy of the model in which every node has a unique name (exclusions address nodes by name)."""
    import onnx

    model = onnx.load(str(src))
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    onnx.save(model, str(dst))
    return dst


class _Reader:
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


def calibrate(pre_model: Path, reader: _Reader, recipe: Recipe, cache: Path, workdir: Path) -> dict[str, Any]:
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
    calibrator.collect_data(reader)
    ranges = calibrator.compute_data()
    if not isinstance(ranges, TensorsData):
        raise TypeError(f"unexpected calibration result {type(ranges)}")
    save_tensors_data(ranges, cache)
    out: dict[str, Any] = {}
    for name, value in ranges.data.items():
        out[name] = (float(np.min(value.range_value[0])), float(np.max(value.range_value[1])))
    return out


def quantize_with(pre_model: Path, out: Path, recipe: Recipe, reader: _Reader, cache: Path) -> Path:
    """`quantize_static` with the recipe and the cached calibration ranges (no re-calibration)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    quantize_static(
        model_input=str(pre_model),
        model_output=str(out),
        calibration_data_reader=reader,
        quant_format=getattr(QuantFormat, recipe.quant_format),
        per_channel=recipe.per_channel,
        reduce_range=recipe.reduce_range,
        activation_type=getattr(QuantType, recipe.activation_type),
        weight_type=getattr(QuantType, recipe.weight_type),
        nodes_to_exclude=list(recipe.excluded),
        calibrate_method=getattr(CalibrationMethod, ort_method(recipe.calibrate_method)),
        calibration_cache_path=cache,
    )
    return out


# -- accuracy -----------------------------------------------------------------------------------


def run_logits(session: Any, images: FloatArray, progress: Progress | None = None, what: str = "") -> FloatArray:
    name = session.get_inputs()[0].name
    outs = []
    for start in range(0, len(images), 32):
        if progress is not None:
            progress.status(f"{what}: {bar(start / len(images))} {start}/{len(images)} images")
        outs.append(np.asarray(session.run(None, {name: images[start : start + 32]})[0], dtype=np.float32))
    return np.concatenate(outs).reshape(len(images), -1)


@dataclass(frozen=True)
class Accuracy:
    """INT8 vs FP32 on one image set."""

    n: int
    top1_agreement: float
    top5_overlap: float
    mean_kl: float
    max_kl: float
    decisive_margin: float
    decisive_n: int
    decisive_agreement: float
    top1_in_fp32_top2: float
    fp32_top1_accuracy: float | None = None
    int8_top1_accuracy: float | None = None
    fp32_top5_accuracy: float | None = None
    int8_top5_accuracy: float | None = None
    labelled: int = 0

    def disagreement(self, gate: str) -> float:
        return 1.0 - (self.decisive_agreement if gate == "decisive" else self.top1_agreement)


def compare_logits(
    ref: FloatArray, test: FloatArray, labels: Sequence[int] | None = None, decisive_margin: float = 0.1
) -> Accuracy:
    """Top-1 agreement, top-5 overlap, KL(softmax FP32 || softmax INT8); agreement on the images
    where FP32 is decisive (top-1 minus top-2 probability >= margin); with labels (-1 =
    unknown) top-1/top-5 accuracy of both."""
    k = min(5, ref.shape[1])
    r1, t1 = ref.argmax(axis=1), test.argmax(axis=1)
    r5 = np.argsort(-ref, axis=1, kind="stable")[:, :k]
    t5 = np.argsort(-test, axis=1, kind="stable")[:, :k]
    overlap = np.array([len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(r5, t5, strict=True)])

    def log_softmax(x: FloatArray) -> npt.NDArray[np.float64]:
        z = x.astype(np.float64)
        z -= z.max(axis=1, keepdims=True)
        result: npt.NDArray[np.float64] = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return result

    lp, lq = log_softmax(ref), log_softmax(test)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
    probs = np.sort(np.exp(lp), axis=1)
    decisive = (probs[:, -1] - probs[:, -2]) >= decisive_margin if ref.shape[1] > 1 else np.ones(len(ref), bool)
    agree = r1 == t1
    extra: dict[str, Any] = {}
    if labels is not None:
        lab = np.asarray(labels, dtype=np.int64)
        known = lab >= 0
        if known.any():
            extra = {
                "fp32_top1_accuracy": float((r1[known] == lab[known]).mean()),
                "int8_top1_accuracy": float((t1[known] == lab[known]).mean()),
                "fp32_top5_accuracy": float((r5[known] == lab[known, None]).any(axis=1).mean()),
                "int8_top5_accuracy": float((t5[known] == lab[known, None]).any(axis=1).mean()),
                "labelled": int(known.sum()),
            }
    return Accuracy(
        n=len(ref),
        top1_agreement=float(agree.mean()),
        top5_overlap=float(overlap.mean()),
        mean_kl=float(kl.mean()),
        max_kl=float(kl.max()),
        decisive_margin=decisive_margin,
        decisive_n=int(decisive.sum()),
        decisive_agreement=float(agree[decisive].mean()) if decisive.any() else 1.0,
        top1_in_fp32_top2=float((t1[:, None] == r5[:, :2]).any(axis=1).mean()),
        **extra,
    )


def grey_level_noise(images: FloatArray, spec: PreprocessSettings, levels: float = 0.5, seed: int = 0) -> FloatArray:
    """`images` plus uniform +-`levels` grey levels of noise, in the model's normalised units.

    FP32 on these vs FP32 on the originals is the noise floor of the agreement numbers: on
    near-ties FP32 flips its own top-1 under noise far below what a JPEG re-encode adds.
    """
    step = np.asarray(spec.scale, np.float64) / np.asarray(spec.std, np.float64)
    step = step[:, None, None] if spec.layout == "NCHW" else step
    noise = np.random.default_rng(seed).uniform(-levels, levels, images.shape) * step
    noisy: FloatArray = (images + noise).astype(np.float32)
    return noisy


# -- search -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    excluded: tuple[str, ...]
    disagreement: float
    mean_kl: float
    phase: str


@dataclass
class SearchResult:
    best: tuple[str, ...]
    best_disagreement: float
    met: bool
    best_mean_kl: float = math.inf
    trials: list[Trial] = field(default_factory=list)


Evaluate = Callable[[Sequence[str]], Accuracy]


def search_exclusions(
    candidates: Sequence[str],
    ranked: Sequence[str],
    evaluate: Evaluate,
    budget: float,
    gate: str = "all",
    max_float: int = 12,
    beam: int = 4,
    max_kl: float | None = None,
) -> SearchResult:
    """The fewest float layers (`candidates` in graph order) for which disagreement <= budget
    (and mean KL <= max_kl, if given).

    1. Contiguous prefixes of 0..max_float layers; the first that meets the budget wins.
       Then it is trimmed from its first layer on while the budget holds, so the float
       layers stay ONE contiguous run: each extra float island costs a DequantizeLinear,
       float kernels and a QuantizeLinear (EfficientNet-Lite0: 8 scattered float layers
       1.53x FP32's speed, a 6-layer prefix 1.8x).
    2. Only if no prefix met it: greedy forward from the best prefix, each round trying the
       next `beam` layers of `ranked` (widest calibrated output range first) and keeping
       the one that lowers disagreement (then mean KL) most, up to max_float layers; then
       a backward pass drops every float layer that is not needed.
    `evaluate` is cached by exclusion set, so nothing is measured twice.
    """
    result = SearchResult((), math.inf, False)
    seen: dict[tuple[str, ...], Accuracy] = {}

    def score(acc: Accuracy) -> tuple[float, float]:
        return (acc.disagreement(gate), acc.mean_kl)

    def meets(acc: Accuracy) -> bool:
        return acc.disagreement(gate) <= budget and (max_kl is None or acc.mean_kl <= max_kl)

    best_score = (math.inf, math.inf)

    def trial(excluded: Sequence[str], phase: str) -> Accuracy:
        nonlocal best_score
        key = tuple(sorted(excluded))
        if key not in seen:
            acc = seen[key] = evaluate(list(excluded))
            result.trials.append(Trial(tuple(excluded), acc.disagreement(gate), acc.mean_kl, phase))
            if score(acc) < best_score:
                best_score = score(acc)
                result.best, result.best_disagreement = tuple(excluded), acc.disagreement(gate)
                result.best_mean_kl = acc.mean_kl
        return seen[key]

    winner: list[str] | None = None
    best_prefix: tuple[tuple[float, float], list[str]] | None = None
    for k in range(min(max_float, len(candidates)) + 1):
        prefix = list(candidates[:k])
        acc = trial(prefix, "prefix")
        if best_prefix is None or score(acc) < best_prefix[0]:
            best_prefix = (score(acc), prefix)
        if meets(acc):
            winner = prefix
            while len(winner) > 1 and meets(trial(winner[1:], "trim")):
                winner = winner[1:]
            break
    if winner is None and best_prefix is not None:
        current = list(best_prefix[1])
        current_acc = trial(current, "prefix")
        while not meets(current_acc) and len(current) < max_float:
            pool = [c for c in ranked if c not in current][:beam]
            if not pool:
                break
            tried = [(score(trial([*current, c], "forward")), c) for c in pool]
            new_score, choice = min(tried)
            if new_score >= score(current_acc):
                break
            current.append(choice)
            current_acc = trial(current, "forward")
        if meets(current_acc):
            winner = current
            for node in list(winner):
                shorter = [n for n in winner if n != node]
                if meets(trial(shorter, "backward")):
                    winner = shorter
    if winner is not None:
        result.best = tuple(winner)
        result.best_disagreement = seen[tuple(sorted(winner))].disagreement(gate)
        result.best_mean_kl = seen[tuple(sorted(winner))].mean_kl
        result.met = True
    return result


# -- speed --------------------------------------------------------------------------------------


def compare_speed(
    models: dict[str, Path], seconds: float, rounds: int, progress: Progress | None = None
) -> dict[str, Any]:
    """`measure.limit` on each model: one pinned single-threaded process, rounds alternating the order."""
    from onnxpool.measure.limit import LimitPlan, measure_alternating, median_ratio
    from onnxpool.workers.cores import plan_layout, usable_cores

    layout = plan_layout(usable_cores(), 1, 1)
    plans = {name: LimitPlan(path, layout, duration=seconds, warmup=min(1.0, seconds)) for name, path in models.items()}

    def step(r: int, name: str) -> None:
        if progress is not None:
            progress.status(f"speed: round {r + 1}/{rounds}, {name}", force=True)

    results = measure_alternating(plans, rounds, step)
    names = list(models)
    return {
        "layout": f"{layout.workers}x{layout.threads}",
        "seconds_per_round": seconds,
        "rounds": rounds,
        "items_per_s": {n: [round(r.items_per_second, 2) for r in results[n]] for n in names},
        "p50_ms": {n: [round(r.percentile(50) * 1000, 3) for r in results[n]] for n in names},
        "speedup": {n: median_ratio(results, n, names[0]) for n in names[1:]},
        "measured_with": "onnxpool.measure.limit (spawned process, pinned, alternating rounds)",
    }


# -- the command --------------------------------------------------------------------------------


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


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("onnxpool", "onnxruntime", "onnx", "numpy", "pillow"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        # mkstemp makes the file 0600; the result is an ordinary file (a server running as
        # another user reads it): the permissions a plain open() would have given it
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def report_path(output: Path) -> Path:
    return output.with_name(output.stem + ".quantize.json")


def run_quantize(opts: QuantizeOptions, progress: Progress) -> dict[str, Any]:
    """The whole command; raises QuantizeError for what the operator can fix. Returns the report."""
    from onnxpool.workers.cores import usable_cores
    from onnxpool.workers.session import DISABLED_OPTIMIZERS, build_session

    if not opts.model.is_file():
        raise QuantizeError(f"model file {opts.model} does not exist")
    if opts.preprocess.dtype != "float32":
        raise QuantizeError(f"[model.preprocess] dtype is {opts.preprocess.dtype}; quantize needs a float32 input")
    if not opts.output.parent.is_dir():
        raise QuantizeError(f"output folder {opts.output.parent} does not exist")
    pipeline = ImagePipeline(opts.preprocess, opts.limits)
    input_name = float_input(opts.model, pipeline.input_shape)
    calib = load_images(opts.calibration, pipeline, "calibration", opts.views, progress)
    held_out = (
        load_images(opts.eval, pipeline, "eval", opts.eval_views, progress, opts.eval_labels, opts.class_names)
        if opts.eval is not None
        else None
    )
    flags = cpu_flags()
    recipe = choose_recipe(flags, opts.calibrate_method)
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
        reader = _Reader(input_name, calib.arrays, progress, batch)
        cache = work / "ranges.json"
        t0 = time.perf_counter()
        ranges = calibrate(pre, reader, recipe, cache, work)
        calibration_seconds = time.perf_counter() - t0
        progress.done(
            f"calibrated ({recipe.calibrate_method}) on {len(calib.names)} images in {calibration_seconds:.1f}s"
        )
        judge = held_out if held_out is not None else calib
        fp32 = build_session(pre, threads)
        ref = run_logits(fp32, judge.arrays, progress, "FP32 reference")
        noisy = grey_level_noise(judge.arrays, opts.preprocess)
        floor = compare_logits(ref, run_logits(fp32, noisy), judge.labels, opts.decisive_margin)
        del fp32, noisy
        progress.done(
            f"FP32 vs FP32 with +-0.5 grey-level noise: top-1 agreement {floor.top1_agreement:.3f}, "
            f"decisive {floor.decisive_agreement:.3f} (the noise floor of these images)"
        )
        evaluated = 0

        def evaluate(excluded: Sequence[str]) -> Accuracy:
            nonlocal evaluated
            evaluated += 1
            nodes = with_activations(pre, [*opts.exclude, *excluded])
            progress.status(f"candidate {evaluated}: {len(excluded) + len(opts.exclude)} float layers", force=True)
            out = quantize_with(pre, work / "candidate.onnx", recipe.with_excluded(nodes), reader, cache)
            logits = run_logits(build_session(out, threads), judge.arrays)
            acc = compare_logits(ref, logits, judge.labels, opts.decisive_margin)
            progress.done(
                f"candidate {evaluated}: {len(excluded) + len(opts.exclude)} float layers: "
                f"top-1 agreement {acc.top1_agreement:.3f}, decisive {acc.decisive_agreement:.3f}, "
                f"KL {acc.mean_kl:.4f}"
            )
            return acc

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
                f"float layers; best reached: {search.best_disagreement:.4f} disagreement (mean KL "
                f"{search.best_mean_kl:.4f}) with {len(search.best)} float layers (FP32 itself under +-0.5 "
                f"grey-level noise: {floor.disagreement(opts.gate):.4f}); nothing written"
            )
        final_nodes = with_activations(pre, [*opts.exclude, *search.best])
        final = quantize_with(pre, work / "final.onnx", recipe.with_excluded(final_nodes), reader, cache)
        logits = run_logits(build_session(final, threads), judge.arrays)
        accuracy = compare_logits(ref, logits, judge.labels, opts.decisive_margin)
        speed = None
        if opts.speed_seconds > 0 and opts.speed_rounds > 0:
            speed = compare_speed({"fp32": pre, "int8": final}, opts.speed_seconds, opts.speed_rounds, progress)
            progress.done(f"speed ({speed['layout']}, pinned): INT8 {speed['speedup']['int8']:.2f}x FP32")
        report: dict[str, Any] = {
            "model": str(opts.model),
            "output": str(opts.output),
            "versions": _versions(),
            "python": platform.python_version(),
            "cpu": {
                "machine": platform.machine(),
                "vnni": has_vnni(flags),
                "avx2": "avx2" in flags,
                "avx512": sorted(f for f in flags if f.startswith("avx512")),
                "flags": sorted(flags),
                "usable_cores": threads,
            },
            "config_file": opts.config_file,
            "preprocess": opts.preprocess.model_dump(mode="json"),
            "recipe": {
                **asdict(recipe),
                "excluded": list(final_nodes),
                "pre_process": "quant_pre_process (ONNX shape inference + onnxruntime basic optimisation)",
                "disabled_optimizers": list(DISABLED_OPTIMIZERS),
                "reduce_range_reason": "x86 without VNNI" if recipe.reduce_range else "VNNI, or not x86: 8-bit weights",
            },
            "float_layers": list(search.best) + list(opts.exclude),
            "calibration": {**calib.describe(), "views_per_file": opts.views, "seconds": round(calibration_seconds, 2)},
            "eval": None if held_out is None else {**held_out.describe(), "views_per_file": opts.eval_views},
            "judged_on": "eval" if held_out is not None else "calibration (no --eval: not held out)",
            "budget": {
                "max_disagreement": opts.max_disagreement,
                "gate": opts.gate,
                "decisive_margin": opts.decisive_margin,
                "max_kl": opts.max_kl,
                "met": True,
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
        _atomic_write(opts.output, lambda p: p.write_bytes(final.read_bytes()))
        try:
            _atomic_write(report_path(opts.output), lambda p: p.write_text(json.dumps(report, indent=1) + "\n"))
        except BaseException:
            opts.output.unlink(missing_ok=True)
            raise
    return report


def rank_by_range(model_path: Path, nodes: Sequence[str], ranges: dict[str, Any]) -> list[str]:
    """`nodes`, widest calibrated output range first: a wide range means coarse INT8 steps."""
    import onnx

    outputs = {n.name: n.output[0] for n in onnx.load(str(model_path)).graph.node if n.output}

    def width(node: str) -> float:
        low, high = ranges.get(outputs.get(node, ""), (0.0, 0.0))
        return float(high - low)

    return sorted(nodes, key=lambda n: -width(n))
