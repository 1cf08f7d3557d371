"""`onnxpool quantize` end to end on small models built here, its search, and every bad input."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from PIL import Image

from onnxpool.cli import main
from onnxpool.quantize.evaluate import Accuracy, compare_logits
from onnxpool.quantize.report import report_path
from onnxpool.quantize.search import search_exclusions
from onnxpool.quantize.targets import host_reduce_range
from onnxpool.workers.cpu_fit import has_vnni, parse_cpu_flags
from tests.tiny_models import _save, small_cnn

SIZE = 16


def _images(folder: Path, n: int, seed: int) -> None:
    """n smooth colour patterns, 20x20 PNG (the server's pipeline crops them to 16x16)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:20, 0:20]
    for i in range(n):
        wave = np.sin(xx * rng.uniform(0.1, 1) + yy * rng.uniform(0.1, 1))[..., None]
        pixels = wave * rng.uniform(20, 120, 3) + rng.uniform(0, 255, 3)
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / f"{i:02d}.png")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("quantize")
    small_cnn(root / "fragile.onnx", SIZE)
    small_cnn(root / "plain.onnx", SIZE, fragile=False)
    _images(root / "calib", 24, seed=1)
    _images(root / "eval" / "3", 16, seed=2)  # class folders: the labels are class indexes 3 and 7
    _images(root / "eval" / "7", 16, seed=3)
    (root / "settings.toml").write_text(f"[task.preprocess]\nresize = {SIZE}\ncrop = {SIZE}\n")
    return root


def quantize(work: Path, model: str | Path, out: Path, *extra: str) -> int:
    """`onnxpool quantize` of work/model (or a path) with work's images and settings; extra args win.

    `--target host` unless given: judged natively, no emulation (tests/test_quantize_targets.py
    has the other targets)."""
    argv = ["quantize", str(work / model), "--calibration", str(work / "calib"), "-o", str(out)]
    target = [] if "--target" in extra else ["--target", "host"]
    argv += ["--config", str(work / "settings.toml"), "--quiet", *target, *extra]
    return main(argv)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("onnxpool: error: ")
    return err


def test_end_to_end_through_the_cli(work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plain.int8.onnx"
    (work / "calib" / "notes.txt").write_text("not an image")
    try:
        code = quantize(
            work,
            "plain.onnx",
            out,
            "--eval",
            str(work / "eval"),
            "--max-disagreement",
            "0.15",
            "--speed-seconds",
            "0.5",
        )
    finally:
        (work / "calib" / "notes.txt").unlink()
    assert code == 0, capsys.readouterr().err
    assert "wrote" in capsys.readouterr().out
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    umask = os.umask(0)
    os.umask(umask)
    for written in (out, report_path(out)):  # ordinary files, not mkstemp's 0600
        assert written.stat().st_mode & 0o777 == 0o666 & ~umask
    report = json.loads(report_path(out).read_text())
    assert report["calibration"]["skipped_not_images"] == 1 and report["calibration"]["images"] == 24
    assert report["eval"]["images"] == 32 and report["judged_on"] == "eval"
    assert report["cpu"]["vnni"] == has_vnni(frozenset(report["cpu"]["flags"]))
    assert report["recipe"]["reduce_range"] == (report["cpu"]["machine"] == "x86_64" and not report["cpu"]["vnni"])
    assert report["recipe"]["disabled_optimizers"] == ["WeightBiasQuantization"]
    assert report["versions"]["onnxruntime"] and len(report["calibration"]["sha256"]) == 64
    accuracy = report["accuracy"]
    assert accuracy["top1_agreement"] >= 0.85 and accuracy["labelled"] == 32
    assert accuracy["fp32_top1_accuracy"] is not None and accuracy["int8_top5_accuracy"] is not None
    assert 0.5 <= report["fp32_noise_floor"]["top1_agreement"] <= 1.0
    assert report["search"]["trials"][0]["excluded"] == []
    assert report["speed"]["speedup"]["int8"] > 0  # default: measured with measure.limit's pinned processes


@pytest.mark.parametrize("method", ["Percentile", "Entropy", "MinMaxMean"])
def test_calibration_methods_and_eval_views(
    method: str, work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 24 calibration images: not a multiple of the reader's batch of 16, which onnxruntime's
    # histogram collector cannot take as a last, smaller batch (and MinMaxMean averages over).
    out = tmp_path / "plain.int8.onnx"
    code = quantize(
        work, "plain.onnx", out, "--method", method, "--eval", str(work / "eval"), "--eval-views", "2",
        "--max-disagreement", "1", "--speed-seconds", "0",
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    report = json.loads(report_path(out).read_text())
    assert report["recipe"]["calibrate_method"] == method and report["calibration"]["images"] == 24
    assert report["eval"]["views_per_file"] == 2 and report["eval"]["images"] == 64


def test_the_search_keeps_the_fragile_layer_float(work: Path, tmp_path: Path) -> None:
    out = tmp_path / "fragile.int8.onnx"
    assert quantize(work, "fragile.onnx", out, "--max-disagreement", "0.15", "--speed-seconds", "0") == 0
    report = json.loads(report_path(out).read_text())
    assert report["float_layers"] == ["conv_b"]
    assert report["search"]["trials"][0]["disagreement"] > 0.15  # all-INT8 fails: the layer IS fragile
    assert report["accuracy"]["top1_agreement"] >= 0.85
    float_convs = {n.name for n in onnx.load(str(out)).graph.node if n.op_type == "Conv"}
    assert "conv_b" in float_convs


def test_served_sessions_keep_float_layers_float(work: Path, tmp_path: Path) -> None:
    """onnxruntime's WeightBiasQuantization would re-quantize conv_b when a session loads."""
    import onnxruntime as ort

    from onnxpool.workers.session import build_session

    out = tmp_path / "fragile.int8.onnx"
    assert quantize(work, "fragile.onnx", out, "--max-disagreement", "0.15", "--speed-seconds", "0") == 0
    batch = np.random.default_rng(0).uniform(-1, 1, (8, 3, SIZE, SIZE)).astype(np.float32)
    ref = build_session(work / "fragile.onnx", 1).run(None, {"input": batch})[0]
    ours = build_session(out, 1).run(None, {"input": batch})[0]
    default = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"input": batch})[0]
    assert np.abs(ours - ref).max() < np.abs(default - ref).max() / 4


def test_unmet_budget_says_the_best_and_writes_nothing(
    work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "never.onnx"
    code = quantize(work, "fragile.onnx", out, "--max-disagreement", "0.01", "--max-float", "0", "--speed-seconds=0")
    assert code == 2
    assert "best reached" in one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", ["missing", "empty", "file", "no-images"])
def test_bad_calibration_folders(case: str, work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "calib"
    if case == "empty":
        folder.mkdir()
    elif case == "file":
        folder.write_text("x")
    elif case == "no-images":
        folder.mkdir()
        (folder / "a.txt").write_text("hello")
        (folder / "b.jpg").write_bytes(b"\xff\xd8\xff broken")
    argv = ["quantize", str(work / "plain.onnx"), "--calibration", str(folder), "-o", str(tmp_path / "o.onnx")]
    assert main([*argv, "--config", str(work / "settings.toml"), "--quiet"]) == 2
    message = one_error_line(capsys)
    expected = {"missing": "does not exist", "empty": "is empty", "file": "is not a folder", "no-images": "2 files"}
    assert expected[case] in message
    assert not (tmp_path / "o.onnx").exists()


def test_unreadable_folder(work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    if os.geteuid() == 0:
        pytest.skip("root reads every folder")
    folder = tmp_path / "locked"
    folder.mkdir()
    (folder / "a.png").write_bytes((work / "calib" / "00.png").read_bytes())
    folder.chmod(0)
    try:
        assert quantize(work, "plain.onnx", tmp_path / "o.onnx", "--calibration", str(folder)) == 2
    finally:
        folder.chmod(0o755)
    assert "cannot be read" in one_error_line(capsys)


def test_models_that_cannot_be_quantized(work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["input"], ["logits"], to=TensorProto.FLOAT)],
        "int_input",
        [helper.make_tensor_value_info("input", TensorProto.INT64, ["batch", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3, SIZE, SIZE])],
    )
    _save(graph, tmp_path / "ints.onnx", opset=17)
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    cases = [("ints.onnx", "float32 input"), ("junk.onnx", "not an ONNX model"), ("none", "exist")]
    cases.append((str(work / "plain.onnx"), "pass the model's settings with --config"))  # 16x16 model, 24x24 images
    (work / "big.toml").write_text("[task.preprocess]\nresize = 24\ncrop = 24\n")
    for model, expected in cases:
        config = work / ("big.toml" if model.startswith("/") else "settings.toml")
        assert quantize(work, tmp_path / model, tmp_path / "o.onnx", "--config", str(config)) == 2
        assert expected in one_error_line(capsys)
    assert not (tmp_path / "o.onnx").exists()


def test_recipe_follows_the_cpu() -> None:
    flags = parse_cpu_flags("processor\t: 0\nflags\t\t: fpu sse avx2 avx512_vnni\n\nprocessor\t: 1\nflags : x\n")
    assert flags == frozenset({"fpu", "sse", "avx2", "avx512_vnni"})
    assert not host_reduce_range(flags, "x86_64")  # VNNI: no int16 saturation, full 8 bits
    assert host_reduce_range(frozenset({"avx2"}), "x86_64")  # AVX2 only: 7-bit weights
    assert not host_reduce_range(frozenset(), "aarch64")


def _acc(disagreement: float) -> Accuracy:
    return Accuracy(10, 1 - disagreement, 1.0, disagreement, disagreement, 0.1, 10, 1 - disagreement, 1.0)


def test_search_prefers_a_prefix_then_trims_its_start() -> None:
    layers = ["a", "b", "c", "d", "e"]
    calls: list[tuple[str, ...]] = []

    def evaluate(excluded: Sequence[str]) -> Accuracy:
        chosen = tuple(excluded)
        calls.append(chosen)
        return _acc(0.0 if "c" in chosen else 0.2)

    result = search_exclusions(layers, layers, evaluate, budget=0.05)
    assert result.met and result.best == ("c",)
    assert calls == [(), ("a",), ("a", "b"), ("a", "b", "c"), ("b", "c"), ("c",)]
    # the float layers stay one run: "b" is not dropped out of the middle of a, b, c
    contiguous = search_exclusions(layers, layers, lambda e: _acc(0.0 if {"a", "c"} <= set(e) else 0.2), 0.05)
    assert contiguous.best == ("a", "b", "c")


def test_search_goes_beyond_the_prefix_by_range() -> None:
    def evaluate(excluded: Sequence[str]) -> Accuracy:
        return _acc(0.0 if "e" in excluded else 0.2)

    result = search_exclusions(["a", "b", "c", "d", "e"], ["e", "d"], evaluate, budget=0.05, max_float=2)
    assert result.met and result.best == ("e",)  # forward: "e" added to the best prefix (none)
    missed = search_exclusions(["a", "b"], ["b"], lambda _: _acc(0.3), budget=0.05)
    assert not missed.met and missed.best == () and missed.best_disagreement == pytest.approx(0.3)


def test_compare_logits() -> None:
    ref = np.array([[5.0, 0.0, 0.0], [0.1, 0.0, 0.0], [0.0, 3.0, 0.0]], np.float32)
    test = np.array([[5.0, 0.0, 0.0], [0.0, 0.1, 0.0], [0.0, 3.0, 0.0]], np.float32)
    acc = compare_logits(ref, test, labels=[0, 0, -1])
    assert acc.top1_agreement == pytest.approx(2 / 3)
    assert acc.decisive_n == 2 and acc.decisive_agreement == 1.0  # the near-tie is not decisive
    assert acc.labelled == 2 and acc.fp32_top1_accuracy == 1.0 and acc.int8_top1_accuracy == 0.5


def test_search_with_a_kl_bound() -> None:
    def evaluate(excluded: Sequence[str]) -> Accuracy:
        acc = _acc(0.0)  # every candidate agrees top-1; only keeping "c" float brings the KL down
        return Accuracy(**{**acc.__dict__, "mean_kl": 0.01 if "c" in excluded else 0.05})

    result = search_exclusions(["a", "b", "c", "d"], [], evaluate, budget=0.01, max_kl=0.02)
    assert result.met and result.best == ("c",)
    assert search_exclusions(["a", "b", "c", "d"], [], evaluate, budget=0.01).best == ()


def test_labels_file_by_name_or_index(tmp_path: Path) -> None:
    from onnxpool.quantize.errors import QuantizeError
    from onnxpool.quantize.images import class_index, read_label_file

    labels = tmp_path / "labels.tsv"
    labels.write_text("# file<TAB>class\na.jpg\ttabby\nsub/b.png,3\n")
    assert read_label_file(labels) == {"a.jpg": "tabby", "sub/b.png": "3"}
    names = ["goldfish", "Tabby", "tiger cat", "x"]
    assert class_index("tabby", names) == 1 and class_index("3", names) == 3
    with pytest.raises(QuantizeError, match="neither"):
        class_index("zebra", names)
    labels.write_text("a.jpg\n")
    with pytest.raises(QuantizeError, match="line 1"):
        read_label_file(labels)


def test_grey_level_noise_is_in_normalised_units() -> None:
    from onnxpool.quantize.evaluate import grey_level_noise
    from onnxpool.tasks.image.settings import PreprocessSettings

    spec = PreprocessSettings(mean=(0.0, 0.0, 0.0), std=(1.0, 2.0, 4.0), scale=1.0)
    images = np.zeros((4, 3, 8, 8), np.float32)
    noisy = grey_level_noise(images, spec)
    assert noisy.dtype == np.float32
    assert [float(np.abs(noisy[:, c]).max()) for c in range(3)] == pytest.approx([0.5, 0.25, 0.125], rel=0.05)


def test_minmax_mean_ranges_lie_within_minmax_ranges(work: Path, tmp_path: Path) -> None:
    # the mean of per-batch extremes is never outside the extremes of all images, and with
    # batches that differ it is strictly inside for some tensor
    from onnxpool.quantize.calibrate import Reader, calibrate
    from onnxpool.quantize.targets import MINMAX_BATCH, Recipe

    rng = np.random.default_rng(0)
    images = rng.normal(0, 1, (3 * MINMAX_BATCH, 3, SIZE, SIZE)).astype(np.float32)
    images[0] *= 8  # one outlier image in the first batch
    ranges = {}
    for method in ("MinMax", "MinMaxMean"):
        reader = Reader("input", images, None, MINMAX_BATCH)
        folder = tmp_path / method
        folder.mkdir()
        ranges[method] = calibrate(work / "plain.onnx", reader, Recipe(calibrate_method=method), folder / "r", folder)
    assert ranges["MinMax"].keys() == ranges["MinMaxMean"].keys()
    for name, (low, high) in ranges["MinMaxMean"].items():
        assert ranges["MinMax"][name][0] <= low <= high <= ranges["MinMax"][name][1], name
    assert any(ranges["MinMaxMean"][n] != ranges["MinMax"][n] for n in ranges["MinMax"])
