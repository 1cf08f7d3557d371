"""A user's task from a file outside the package, served through real gunicorn: the complete examples
of docs/TASKS.md (the scorer, the detector and the CSV scorer), taken from the page itself (code,
settings, labels and the replies it promises)."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from PIL import Image

from tests.harness import REPO, running_server, start_server
from tests.tiny_models import linear_regressor
from tools.build_detector import build_detector

pytestmark = pytest.mark.slow

PAGE = (REPO / "docs" / "TASKS.md").read_text()


def _block(language: str, first_line: str) -> str:
    """The fenced code block of `language` on the page that starts with `first_line`."""
    for body in re.findall(rf"```{language}\n(.*?)```", PAGE, re.S):
        if body.startswith(first_line):
            return str(body)
    raise AssertionError(f"docs/TASKS.md has no {language} block starting {first_line!r}")


def _example(folder: Path, **task_settings: object) -> Path:
    (folder / "scorer.py").write_text(_block("python", '"""scorer.py'))
    config = _block("toml", "# scorer.toml")
    for key, value in task_settings.items():
        config = re.sub(rf"^{key} = .*$", f"{key} = {json.dumps(value)}", config, flags=re.M)
    linear_regressor(folder / "scorer.onnx", features=3)  # x (n, 3) -> y (n, 1) = 2 * sum
    (folder / "scorer.toml").write_text(config)
    return folder / "scorer.toml"


def test_the_documented_task_serves_from_a_file(tmp_path: Path) -> None:
    config = _example(tmp_path)
    shell = _block("sh", "onnxpool serve --config scorer.toml")
    sent = re.search(r"-d '(.*?)'", shell)
    promised = re.search(r"^# (\{.*\})$", shell, re.M)
    assert sent is not None and promised is not None
    with running_server(tmp_path, {"ONNXPOOL_SERVER__WORKERS": "2"}, config=config, workers=2) as server:
        reply = requests.post(server.url + "/score", data=sent.group(1), timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json() == json.loads(promised.group(1))
        again = requests.post(server.url + "/score", data=sent.group(1), timeout=30)
        assert again.headers["X-Cache"] == "HIT" and again.content == reply.content
        bad = requests.post(server.url + "/score", json={"measurements": [[1, 2]]}, timeout=30)
        assert (bad.status_code, bad.json()["error"]) == (400, "measurements.0.2: Field required")
        assert requests.post(server.url + "/predict", json={}, timeout=30).status_code == 404  # only its routes
        paths = requests.get(server.url + "/openapi.json", timeout=30).json()["paths"]
        assert "post" in paths["/score"]
        assert "task: scorer; routes: POST /score" in server.log()


def test_a_bad_task_setting_stops_the_start_with_one_line(tmp_path: Path) -> None:
    config = _example(tmp_path, threshold=-1)
    server = start_server(tmp_path, {}, config=config, wait=False)
    try:
        assert server.process.wait(timeout=60) == 1
    finally:
        server.stop()
    assert f"task scorer: task.threshold = -1 (from file {config}): Input should be greater than 0" in server.log()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "image-classifier",
            "not a built-in task (image-classification, tabular, tensors, text-embedding, text-classification) nor",
        ),
        ("tests.nowhere:Scorer", "cannot import tests.nowhere: ModuleNotFoundError"),
        ("tests.tiny_models:Scorer", "tests.tiny_models has no Task subclass named Scorer"),
        ("tests.tiny_models:Path", "tests.tiny_models has no Task subclass named Path"),
        ("/nonexistent/scorer.py:Scorer", "file /nonexistent/scorer.py does not exist"),
    ],
)
def test_task_names_that_cannot_be_served_are_one_line(spec: str, message: str) -> None:
    from onnxpool.tasks.api import TaskConfigError
    from onnxpool.tasks.registry import task_class

    with pytest.raises(TaskConfigError) as err:
        task_class(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_task_by_module_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxpool.tasks.registry import task_class

    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(_block("python", '"""scorer.py'))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert task_class("mypkg.tasks:Scorer").name == "scorer"


# ------------------------------------------------------------------ the detector: boxes in the photo's pixels


def _detector(folder: Path) -> tuple[Path, str]:
    """The page's detector.py, detector.toml and labels file in `folder` (not the server's working
    directory: the labels path resolves against the settings file), and the page's shell block."""
    folder.mkdir()
    (folder / "detector.py").write_text(_block("python", '"""detector.py'))
    (folder / "detector.toml").write_text(_block("toml", "# detector.toml"))
    shell = _block("sh", "python tools/build_detector.py detector.onnx")
    labels = re.search(r"printf '(.*?)' > (\S+)", shell)
    assert labels is not None
    (folder / labels.group(2)).write_text(labels.group(1).replace("\\n", "\n"))
    build_detector(folder / "detector.onnx")
    return folder / "detector.toml", shell


def _png(image: Image.Image, orientation: int = 1) -> bytes:
    """Lossless, so two encodings of the same pixels decode to the same pixels."""
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation  # EXIF Orientation
    out = io.BytesIO()
    image.save(out, "PNG", exif=exif.tobytes())
    return out.getvalue()


def _detect(url: str, photo: bytes) -> dict[str, Any]:
    reply = requests.post(url + "/detect", files={"image": ("photo.png", photo, "image/png")}, timeout=30)
    assert reply.status_code == 200, reply.text
    found: dict[str, Any] = reply.json()["photos"][0]
    return found


def _same_boxes(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], scale: float = 1.0, tol: float = 0.5) -> bool:
    """Every detection has one in `theirs` of the same label whose box is `scale` times its own (within `tol`)."""
    if len(ours) != len(theirs):
        return False
    for mine in ours:
        box = np.array(mine["box"]) * scale
        if not any(
            other["label"] == mine["label"] and np.abs(np.array(other["box"]) - box).max() <= tol for other in theirs
        ):
            return False
    return True


def test_the_documented_detector_serves_the_documented_reply(tmp_path: Path) -> None:
    config, shell = _detector(tmp_path / "site")
    photo = re.search(r"-F image=@(\S+)", shell)
    promised = re.search(r"^# (\{.*\})$", shell, re.M)
    assert photo is not None and promised is not None
    expected = json.loads(promised.group(1))
    with running_server(tmp_path, {"ONNXPOOL_SERVER__WORKERS": "1"}, config=config, workers=1) as server:
        sent = (REPO / photo.group(1)).read_bytes()
        reply = requests.post(server.url + "/detect", files={"image": ("cat.jpg", sent, "image/jpeg")}, timeout=30)
        assert reply.status_code == 200, reply.text
        got = reply.json()
        assert got["model"] == expected["model"] and len(got["photos"]) == 1
        (mine,), (page,) = got["photos"], expected["photos"]
        assert (mine["width"], mine["height"]) == (page["width"], page["height"])
        assert [d["label"] for d in mine["detections"]] == [d["label"] for d in page["detections"]]
        assert np.allclose(
            [d["score"] for d in mine["detections"]], [d["score"] for d in page["detections"]], atol=2e-3
        )
        assert _same_boxes(mine["detections"], page["detections"], tol=0.2)  # the page's numbers, to rounding
        raw = requests.post(server.url + "/detect", data=sent, headers={"Content-Type": "image/jpeg"}, timeout=30)
        assert raw.json() == got  # a raw image/* body is the same photo
        assert raw.headers["X-Cache"] == "HIT"  # canonical: the photo's bytes, not the framing
        two = requests.post(server.url + "/detect", files=[("image", sent), ("image", sent)], timeout=30)
        assert two.status_code == 200 and two.json()["photos"] == [mine, mine]
        bad = requests.post(server.url + "/detect", files={"image": ("x.jpg", b"not a photo")}, timeout=30)
        assert bad.status_code in (415, 422) and "image[0]" in bad.json()["error"]
        wrong = requests.post(server.url + "/detect", json={"image": "cat"}, timeout=30)
        assert wrong.status_code == 415 and "multipart/form-data" in wrong.json()["error"]
        assert "task: detector; routes: POST /detect" in server.log()


def test_the_detectors_boxes_are_in_each_photos_own_pixels(tmp_path: Path) -> None:
    config, _ = _detector(tmp_path / "site")
    cat = Image.open(REPO / "models" / "samples" / "chelsea-cat.jpg").convert("RGB")
    width, height = cat.size
    assert width > height  # a wide photo
    photos = {
        "wide": _png(cat),
        "double": _png(cat.resize((2 * width, 2 * height), Image.Resampling.LANCZOS)),
        "tall": _png(cat.transpose(Image.Transpose.ROTATE_270)),  # turned a quarter clockwise: tall
        "sideways": _png(cat, orientation=6),  # the wide pixels, with EXIF "turn a quarter clockwise to show"
    }
    settings = {"ONNXPOOL_SERVER__WORKERS": "1", "ONNXPOOL_TASK__MIN_SCORE": "0"}  # every detection
    with running_server(tmp_path, settings, config=config, workers=1) as server:
        found = {name: _detect(server.url, photo) for name, photo in photos.items()}
    sizes = {name: (f["width"], f["height"]) for name, f in found.items()}
    assert sizes == {
        "wide": (width, height),
        "double": (2 * width, 2 * height),
        "tall": (height, width),
        "sideways": (height, width),
    }
    boxes = {name: np.array([d["box"] for d in f["detections"]]) for name, f in found.items()}
    assert all(len(b) == 16 for b in boxes.values())
    # The model saw the middle square of each photo (resize the shorter side to 224, crop 224 x 224):
    # in the photo's pixels, boxes of the wide photo lie in its middle `height` columns, and of the
    # tall one in its middle `height` rows (the cat's shorter side is the tall photo's width).
    margin = (width - height) / 2
    wide, tall = boxes["wide"], boxes["tall"]
    assert wide[:, [0, 2]].min() >= margin - 1 and wide[:, [0, 2]].max() <= width - margin + 1
    assert wide[:, [1, 3]].min() >= 0 and wide[:, [1, 3]].max() <= height
    assert tall[:, [1, 3]].min() >= margin - 1 and tall[:, [1, 3]].max() <= width - margin + 1
    assert tall[:, [0, 2]].min() >= 0 and tall[:, [0, 2]].max() <= height
    assert wide[:, [1, 3]].max() > 0.9 * height  # ...and reach the whole height, which was not cropped
    # The same photo twice as large: the same detections, boxes twice as large.
    assert _same_boxes(found["wide"]["detections"], found["double"]["detections"], scale=2.0, tol=1.0)
    # Stored sideways with an EXIF orientation: the boxes of the upright photo.
    assert _same_boxes(found["sideways"]["detections"], found["tall"]["detections"], tol=0.5)


FIRST_API_TASK = """
import numpy as np
from onnxpool.tasks.api import Task, TaskSettings


class OldScorer(Task):
    name = "old-scorer"
    routes = ("/score",)

    def check(self, model):
        pass

    def read(self, request):
        return np.zeros((1, 3), np.float32)

    def canonical(self, inputs):
        return [inputs.tobytes()]

    def feeds(self, inputs, model):
        return {model.inputs[0].name: inputs}

    def reply(self, inputs, outputs):
        return {}
"""


def test_a_task_written_for_the_first_api_is_refused_at_start_with_one_line(tmp_path: Path) -> None:
    config = _example(tmp_path)
    (tmp_path / "old.py").write_text(FIRST_API_TASK)
    config.write_text(config.read_text().replace('task = "scorer.py:Scorer"', 'task = "old.py:OldScorer"'))
    server = start_server(tmp_path, {}, config=config, wait=False)
    try:
        assert server.process.wait(timeout=60) == 1
    finally:
        server.stop()
    lines = [line for line in server.log().splitlines() if "written for the first task API" in line]
    assert len(lines) == 1, server.log()
    assert "OldScorer: it is written for the first task API: rename check(model) to bind(model)" in lines[0]
    assert "'From the first task API'" in lines[0] and "From the first task API" in PAGE


def test_the_detector_runs_in_process_as_the_page_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, shell = _detector(tmp_path / "site")
    (config.parent / "models").mkdir()
    (config.parent / "models" / "samples").symlink_to(REPO / "models" / "samples")
    monkeypatch.chdir(config.parent)
    scope: dict[str, Any] = {}
    snippet = _block("python", "from pathlib import Path\n\nfrom onnxpool.local import")
    exec(snippet, scope)  # the page's snippet, as written
    promised = re.search(r"^# (\{.*\})$", shell, re.M)
    assert promised is not None
    page = json.loads(promised.group(1))
    assert scope["reply"]["photos"][0]["detections"][0]["label"] == page["photos"][0]["detections"][0]["label"]
    assert _same_boxes(scope["reply"]["photos"][0]["detections"], page["photos"][0]["detections"], tol=0.2)
    assert type(scope["result"]).__name__ == "Detections" and scope["result"].sizes == [(451, 300)]


def _csv_example(folder: Path) -> tuple[Path, str]:
    """csv_scorer.py and csv_scorer.toml from the page, beside the iris demo's model and labels; the shell block."""
    (folder / "csv_scorer.py").write_text(_block("python", '"""csv_scorer.py'))
    (folder / "csv_scorer.toml").write_text(_block("toml", "# csv_scorer.toml"))
    for name in ("model.onnx", "labels.txt"):
        shutil.copy(REPO / "models" / "iris" / name, folder / name)
    return folder / "csv_scorer.toml", _block("sh", "onnxpool serve --config csv_scorer.toml")


def test_the_documented_csv_scorer_takes_an_upload_and_a_raw_body(tmp_path: Path) -> None:
    config, shell = _csv_example(tmp_path)
    printed = re.search(r"^printf '(.*?)' > rows\.csv$", shell, re.M)
    promised = re.findall(r"^# (\{.*\})$", shell, re.M)
    assert printed is not None and len(promised) == 2
    rows = printed.group(1).encode().decode("unicode_escape").encode()
    replied, refused = (json.loads(text) for text in promised)
    with running_server(tmp_path, {"ONNXPOOL_CACHE__ENABLED": "false"}, config=config) as server:
        url = server.url + "/score-csv"
        uploaded = requests.post(url, files={"table": ("rows.csv", rows, "text/csv")}, timeout=30)  # curl -F
        raw = requests.post(url, data=rows, headers={"Content-Type": "text/csv"}, timeout=30)  # --data-binary
        assert (uploaded.status_code, uploaded.json()) == (200, replied), uploaded.text
        assert (raw.status_code, raw.json()) == (200, replied), raw.text
        form = requests.post(url, data={"rows": "[]"}, timeout=30)  # curl -d's form type
        assert (form.status_code, form.json()) == (415, refused)
        # What a client gets wrong, each a 4xx naming it.
        wrong_part = requests.post(url, files={"table": ("t.png", b"\x89PNG", "image/png")}, timeout=30)
        assert wrong_part.status_code == 415 and "field 'table' takes text/csv or text/plain" in wrong_part.text
        wrong_field = requests.post(url, files={"tabel": ("rows.csv", rows, "text/csv")}, timeout=30)
        assert wrong_field.status_code == 400 and "no file in field 'table' (fields sent: 'tabel')" in wrong_field.text
        no_column = requests.post(url, data=b"a,b\n1,2\n", headers={"Content-Type": "text/csv"}, timeout=30)
        assert no_column.status_code == 400 and "KeyError('sepal_length')" in no_column.text
        operation = requests.get(server.url + "/openapi.json", timeout=30).json()["paths"]["/score-csv"]["post"]
        content = operation["requestBody"]["content"]
        assert set(content) == {"multipart/form-data", "text/csv", "text/plain"}
        assert content["multipart/form-data"]["schema"]["required"] == ["table"]


def test_the_csv_scorers_task_class_is_under_50_lines() -> None:
    code = _block("python", '"""csv_scorer.py')
    body = code[code.index("class CsvScorer") :]
    assert len(body.strip().splitlines()) < 50
