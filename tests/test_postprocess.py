"""tasks.image.postprocess: labels files, stable scores, top-k; and the demo model end to end in-process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from onnxpool.tasks.classes import LabelsError, load_labels, scores
from onnxpool.tasks.errors import BadRequest
from onnxpool.tasks.image.postprocess import top_k

REPO = Path(__file__).resolve().parents[1]
MODEL_DIR = REPO / "models" / "efficientnet-lite0"
DATA = REPO / "models" / "samples"

# -- labels ----------------------------------------------------------------------


def test_demo_labels_load() -> None:
    labels = load_labels(MODEL_DIR / "labels.txt")
    assert len(labels) == 1000 and labels[0] == "tench" and labels[281] == "tabby"
    assert all(label == label.rstrip() for label in labels)


def test_labels_keep_non_ascii_and_strip_line_ends(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_bytes("\ufeffcafé  \r\n日本の猫\t\n\nÆble\n\n\n".encode())
    # BOM dropped, trailing spaces/CR/tab stripped, inner blank line kept for alignment, tail blanks dropped
    assert load_labels(path) == ["café", "日本の猫", "", "Æble"]


def test_labels_without_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_text("a\nb", encoding="utf-8")
    assert load_labels(path) == ["a", "b"]


def test_unreadable_labels_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(LabelsError, match=r"labels file .*missing\.txt cannot be read"):
        load_labels(tmp_path / "missing.txt")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(LabelsError, match=r"is not UTF-8 \(line 2, byte 6\)"):
        load_labels(latin1)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"\n\n")
    with pytest.raises(LabelsError, match="has no labels"):
        load_labels(empty)
    with pytest.raises(LabelsError, match="cannot be read"):
        load_labels(tmp_path)  # a directory


# -- scores -----------------------------------------------------------------------


def test_softmax_is_a_distribution_and_matches_the_formula() -> None:
    logits = np.random.default_rng(0).normal(0, 3, (4, 10)).astype(np.float32)
    got = scores(logits, "softmax")
    expected = np.exp(logits.astype(np.float64))
    expected /= expected.sum(axis=1, keepdims=True)
    assert got.dtype == np.float32 and got.shape == (4, 10)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_softmax_survives_huge_logits() -> None:
    got = scores(np.array([[1e4, 1e4 - 1.0, -1e4], [1000.0, 0.0, 0.0]], np.float32), "softmax")
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(got[0, 1] / got[0, 0], np.exp(-1.0), rtol=1e-5)


def test_sigmoid_is_stable_and_accurate_at_both_ends() -> None:
    x = np.array([[-1000.0, -50.0, -1.0, 0.0, 1.0, 50.0, 1000.0]], np.float32)
    got = scores(x, "sigmoid")  # filterwarnings=error: an overflow in exp would fail here
    expected = 1.0 / (1.0 + np.exp(-x.astype(np.float64).clip(-700, 700)))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-37)  # float32 underflows below ~1e-38
    assert got[0, 0] == 0.0 and 0.0 < got[0, 1] < 1e-20 and got[0, -1] == 1.0


def test_none_passes_scores_through_as_float32() -> None:
    raw = np.array([[0.2, 0.5, 0.3]], np.float16)
    got = scores(raw, "none")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, raw.astype(np.float32))


def test_output_shapes_are_normalised_to_rows() -> None:
    assert scores(np.zeros(5, np.float32), "softmax").shape == (1, 5)
    assert scores(np.zeros((2, 5, 1, 1), np.float32), "softmax").shape == (2, 5)
    with pytest.raises(ValueError, match=r"\(n, classes\)"):
        scores(np.zeros((2, 5, 4), np.float32), "softmax")
    with pytest.raises(ValueError, match="unknown score mode"):
        scores(np.zeros((1, 5), np.float32), "relu")  # type: ignore[arg-type]


# -- top-k ------------------------------------------------------------------------


def test_top_k_best_first_with_labels_and_python_types() -> None:
    probs = np.array([[0.1, 0.6, 0.05, 0.25], [0.7, 0.1, 0.1, 0.1]], np.float32)
    got = top_k(probs, 2, ["a", "b", "c", "d"])
    assert got == [
        [
            {"label": "b", "index": 1, "score": pytest.approx(0.6)},
            {"label": "d", "index": 3, "score": pytest.approx(0.25)},
        ],
        [
            {"label": "a", "index": 0, "score": pytest.approx(0.7)},
            {"label": "b", "index": 1, "score": pytest.approx(0.1)},
        ],
    ]
    first = got[0][0]
    assert type(first["index"]) is int and type(first["score"]) is float and list(first) == ["label", "index", "score"]


def test_top_k_clamps_k_and_falls_back_to_the_index() -> None:
    probs = np.array([[0.2, 0.5, 0.3]], np.float32)
    assert [r["index"] for r in top_k(probs, 10, None)[0]] == [1, 2, 0]
    assert [r["label"] for r in top_k(probs, 10, None)[0]] == ["1", "2", "0"]
    assert [r["label"] for r in top_k(probs, 3, ["x", ""])[0]] == ["1", "2", "x"]  # short list, empty label


def test_top_k_ties_go_to_the_lower_index() -> None:
    probs = np.array([[0.1, 0.3, 0.3, 0.3]], np.float32)
    assert [r["index"] for r in top_k(probs, 4, None)[0]] == [1, 2, 3, 0]


def test_top_k_agrees_with_a_full_sort() -> None:
    rng = np.random.default_rng(3)
    probs = rng.random((8, 1000)).astype(np.float32)
    for k in (1, 5, 999, 1000):
        got = top_k(probs, k, None)
        for row, reply in zip(probs, got, strict=True):
            assert [r["index"] for r in reply] == list(np.argsort(-row, kind="stable")[:k])


def test_top_k_below_one_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="top_k must be at least 1, got 0"):
        top_k(np.ones((1, 3), np.float32), 0, None)


# -- the demo model, in-process ------------------------------------------------------


def test_demo_model_labels_the_cat_and_the_espresso() -> None:
    ort = pytest.importorskip("onnxruntime")
    from onnxpool.config.settings import LimitsSettings
    from onnxpool.tasks.image.imaging import ImagePipeline
    from onnxpool.tasks.image.settings import PreprocessSettings

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(MODEL_DIR / "model.onnx"), options, providers=["CPUExecutionProvider"])
    batch = ImagePipeline(PreprocessSettings(), LimitsSettings()).preprocess_batch(
        [(DATA / "chelsea-cat.jpg").read_bytes(), (DATA / "coffee.jpg").read_bytes()]
    )
    (logits,) = session.run(["logits"], {"input": batch})
    cat, coffee = top_k(scores(logits, "softmax"), 3, load_labels(MODEL_DIR / "labels.txt"))
    assert {"tabby", "tiger cat", "Egyptian cat"} & {r["label"] for r in cat}
    best = coffee[0]
    assert best["label"] == "espresso" and isinstance(best["score"], float) and best["score"] > 0.5
