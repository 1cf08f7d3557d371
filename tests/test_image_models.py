"""Image models as zoos and exporters ship them, served through real gunicorn with the default settings.

Each variant of the demo model (tests/image_variants.py: channels last, batch fixed to 1, dynamic height
and width, a Softmax at the end) labels the cat as the demo does, for one image and three per request;
a grey MNIST-shaped classifier answers a colour photo (made grey) and a grey PNG as its own session does
on Pillow's grey pixels. An image task on a model that no setting makes fit stops the start with one
line, and a HUP to such a model keeps the last good one. No request here gets a 500.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import requests
from PIL import Image

from tests import image_variants
from tests.harness import DATA, DEMO_MODEL, MODEL_NAME, Server, running_server, start_and_collect
from tests.test_reload import hup_and_wait
from tests.tiny_models import linear_regressor

pytestmark = pytest.mark.slow

CAT = (DATA / "chelsea-cat.jpg").read_bytes()
COFFEE = (DATA / "coffee.jpg").read_bytes()
LABELS = DEMO_MODEL.parent / "labels.txt"
DEMO_CAT_SCORE = 0.393  # the demo's top-1 for the cat (Egyptian cat), rounded


def predict(server: Server, *images: tuple[bytes, str], top_k: int = 5) -> list[list[dict[str, Any]]]:
    files = [("image", (f"i{i}", data, kind)) for i, (data, kind) in enumerate(images)]
    reply = requests.post(f"{server.url}/predict", files=files, params={"top_k": top_k}, timeout=60)
    assert reply.status_code == 200, reply.text
    predictions: list[list[dict[str, Any]]] = reply.json()["predictions"]
    return predictions


def settings_for(model: Path, **extra: str) -> dict[str, str]:
    # The labels are the demo's: the variants' folders have none of their own.
    return {"ONNXPOOL_MODEL__PATH": str(model), "ONNXPOOL_TASK__LABELS": str(LABELS), **extra}


@pytest.fixture(scope="module")
def demo_answer(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The demo model's own top-5 for the cat, as the server answers it."""
    with running_server(tmp_path_factory.mktemp("demo"), settings_for(DEMO_MODEL), workers=1) as srv:
        return predict(srv, (CAT, "image/jpeg"))[0]


def assert_same(answer: list[dict[str, Any]], expected: list[dict[str, Any]], tolerance: float) -> None:
    assert [p["label"] for p in answer] == [p["label"] for p in expected]
    for got, want in zip(answer, expected, strict=True):
        assert abs(got["score"] - want["score"]) <= tolerance, (got, want)


VARIANTS = {
    "nhwc": (image_variants.nhwc, "NHWC (3 channels last)"),
    "batch-1": (image_variants.fixed_batch, "the model's batch is fixed at 1"),
    "dynamic-size": (image_variants.dynamic_size, "RGB 224x224"),
    "softmax": (image_variants.ending_in_softmax, "scores: none (output 'probabilities' is made by a Softmax node"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_zoo_shaped_variant_labels_the_cat_as_the_demo_does(
    tmp_path: Path, variant: str, demo_answer: list[dict[str, Any]]
) -> None:
    build, said = VARIANTS[variant]
    model = build(tmp_path / f"{variant}.onnx")
    with running_server(tmp_path, settings_for(model), workers=1) as srv:
        one = predict(srv, (CAT, "image/jpeg"))
        three = predict(srv, (CAT, "image/jpeg"), (COFFEE, "image/jpeg"), (CAT, "image/jpeg"))
        log = srv.log()
    assert said in log
    assert re.search(r"answered its own sample request \(POST /predict\) on the model in [0-9.]+ s", log)
    assert_same(one[0], demo_answer, 1e-5)
    assert len(three) == 3
    assert_same(three[0], demo_answer, 1e-5)
    assert_same(three[2], demo_answer, 1e-5)
    assert three[1][0]["label"] != demo_answer[0]["label"]  # the coffee is no cat: the rows are not mixed up
    if variant == "softmax":  # the probabilities as the model makes them, not a second softmax's ~1/1000
        assert abs(one[0][0]["score"] - DEMO_CAT_SCORE) < 5e-4
        assert abs(one[0][0]["score"] - demo_answer[0]["score"]) < 1e-5


def test_a_softmax_the_graph_hides_is_found_by_the_sample_rows(tmp_path: Path) -> None:
    # A Softmax behind an op the graph reader does not look through (Abs: the values stay as they are):
    # the rows on the task's own sample photo sum to 1, so the scores are taken as they are.
    model = image_variants.ending_in_softmax(tmp_path / "hidden.onnx", behind="Abs")
    with running_server(tmp_path, settings_for(model), workers=1) as srv:
        top = predict(srv, (CAT, "image/jpeg"))[0][0]
        log = srv.log()
    assert "scores: none (output 'probabilities', made by Abs: its rows on the task's sample already sum to 1" in log
    assert top["label"] == "Egyptian cat" and abs(top["score"] - DEMO_CAT_SCORE) < 5e-4


def grey_reference(model: Path, photo: bytes) -> np.ndarray:
    """The grey model's own logits on Pillow's grey (L) version of the photo, as the task prepares it by
    default: shorter side to 32, centre crop 28, (pixel - 127) / 128 (the demo's mean and std, one channel)."""
    im = Image.open(io.BytesIO(photo)).convert("L")
    w, h = im.size
    new = (32, max(32, int(32 * h / w))) if w <= h else (max(32, int(32 * w / h)), 32)
    im = im.resize(new, Image.Resampling.BILINEAR)
    left, top = round((new[0] - 28) / 2), round((new[1] - 28) / 2)
    pixels = np.asarray(im.crop((left, top, left + 28, top + 28)), np.float32)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    logits: np.ndarray = np.asarray(session.run(None, {"Input3": ((pixels - 127) / 128)[None, None]})[0])[0]
    return logits


def test_a_grey_digit_classifier_answers_colour_photos_and_grey_pngs(tmp_path: Path) -> None:
    model = image_variants.grey_digits(tmp_path / "mnist.onnx")
    grey = io.BytesIO()
    Image.open(io.BytesIO(COFFEE)).convert("L").save(grey, "PNG")
    png = grey.getvalue()
    with running_server(tmp_path, {"ONNXPOOL_MODEL__PATH": str(model)}, workers=1) as srv:
        one = predict(srv, (CAT, "image/jpeg"), top_k=10)
        three = predict(srv, (CAT, "image/jpeg"), (png, "image/png"), (COFFEE, "image/jpeg"), top_k=10)
        log = srv.log()
    assert "input 'Input3': NCHW (1 channel first), grey 28x28" in log
    assert len(three) == 3 and three[0] == one[0]
    for answer, photo in ((one[0], CAT), (three[1], png)):
        logits = grey_reference(model, photo)
        probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        assert [p["index"] for p in answer][:3] == list(np.argsort(-probabilities)[:3])
        # JPEG's grey draft decode vs. Pillow's convert("L") of the RGB decode: a grey level or so apart
        assert max(abs(p["score"] - probabilities[p["index"]]) for p in answer) < 2e-3
    assert [p["index"] for p in three[1]] == [p["index"] for p in three[2]]  # the PNG is the grey coffee


def test_an_image_task_on_a_model_no_setting_fits_stops_the_start_in_one_line(tmp_path: Path) -> None:
    model = linear_regressor(tmp_path / "rows.onnx", features=10)
    settings = {"ONNXPOOL_MODEL__PATH": str(model), "ONNXPOOL_MODEL__TASK": "image-classification"}
    code, lines = start_and_collect(tmp_path, settings)
    assert code not in (0, None)
    assert len(lines) == 1, lines
    assert "input 'x' [N, 10] is not an image input" in lines[0]
    assert "[task] input_name" in lines[0] and '[model] task = "tensors"' in lines[0]


def test_a_hup_to_a_model_the_task_cannot_serve_keeps_the_last_good_one(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    image_variants.nhwc(model)
    with running_server(tmp_path, settings_for(model, ONNXPOOL_MODEL__TASK="image-classification"), workers=1) as srv:
        before = predict(srv, (CAT, "image/jpeg"))
        linear_regressor(tmp_path / "rows.onnx", features=10)
        os.replace(tmp_path / "rows.onnx", model)
        hup_and_wait(srv, 1)
        log = srv.log()
        assert "input 'x' [N, 10] is not an image input" in log
        assert "reload: keeping the running configuration and the last good model" in log
        assert predict(srv, (CAT, "image/jpeg")) == before


def test_feeds_onnxruntime_refuses_are_a_400_naming_the_input(tmp_path: Path) -> None:
    # v2 infer sends the model's tensors as they are; 8x8 pixels fit [N, 3, h, w] but not the graph, whose
    # convolutions shrink them to nothing: onnxruntime's INVALID_ARGUMENT, once a 500.
    model = image_variants.dynamic_size(tmp_path / "dynamic.onnx")
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 8, 8], "data": [0.0] * (3 * 8 * 8)}]}
    with running_server(tmp_path, settings_for(model), workers=1) as srv:
        pids = srv.workers()
        reply = requests.post(f"{srv.url}/v2/models/{MODEL_NAME}/infer", json=body, timeout=60)
        assert reply.status_code == 400, reply.text
        assert "the model cannot run on input 'input' float32 [1, 3, 8, 8]: " in reply.json()["error"]
        assert "Invalid input shape" in reply.json()["error"]
        assert srv.workers() == pids
        assert "Traceback" not in srv.log()
