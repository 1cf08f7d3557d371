"""The image endpoint through REAL gunicorn: labels for real photos, odd formats, limits, UTF-8 labels."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from PIL import Image

from tests.harness import DATA, MODEL_NAME, Server, proc_status, running_server
from tests.tiny_models import channel_classifier

CAT = (DATA / "chelsea-cat.jpg").read_bytes()
COFFEE = (DATA / "coffee.jpg").read_bytes()
CAT_CLASSES = {"tabby", "tiger cat", "Egyptian cat", "Persian cat", "Siamese cat"}


def encode(image: Image.Image, fmt: str, **params: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


def predict(server: Server, *images: bytes, top_k: int = 3, path: str = "/predict") -> list[list[dict[str, Any]]]:
    files = [("image", (f"img{i}", data, "application/octet-stream")) for i, data in enumerate(images)]
    reply = requests.post(f"{server.url}{path}", files=files, params={"top_k": top_k}, timeout=30)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == MODEL_NAME
    predictions: list[list[dict[str, Any]]] = body["predictions"]
    return predictions


def top1(server: Server, image: bytes) -> object:
    return predict(server, image, top_k=1)[0][0]["label"]


def test_cat_and_espresso(server: Server) -> None:
    cat, coffee = predict(server, CAT), predict(server, COFFEE, path=f"/v2/models/{MODEL_NAME}/classify")
    assert CAT_CLASSES & {p["label"] for p in cat[0]}
    assert coffee[0][0]["label"] == "espresso"
    assert coffee[0][0]["index"] == 967
    scores = [p["score"] for p in cat[0]]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0


def test_raw_image_body(server: Server) -> None:
    reply = requests.post(f"{server.url}/predict", data=COFFEE, headers={"Content-Type": "image/jpeg"}, timeout=30)
    assert reply.status_code == 200
    assert reply.json()["predictions"][0][0]["label"] == "espresso"


def test_three_images_come_back_in_order(server: Server) -> None:
    predictions = predict(server, COFFEE, CAT, COFFEE, top_k=5)
    assert len(predictions) == 3 and all(len(p) == 5 for p in predictions)
    assert predictions[0][0]["label"] == "espresso" and predictions[2][0]["label"] == "espresso"
    assert CAT_CLASSES & {p["label"] for p in predictions[1]}


def test_top_k_is_bounded_and_checked(server: Server) -> None:
    assert len(predict(server, CAT, top_k=5000)[0]) == 1000
    reply = requests.post(f"{server.url}/predict?top_k=zero", files={"image": CAT}, timeout=30)
    assert reply.status_code == 400 and "top_k must be a positive integer" in reply.json()["error"]


def post_multipart(server: Server, boundary: str, body: bytes) -> requests.Response:
    """POST a hand-built multipart/form-data body to /predict, exactly as given."""
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    return requests.post(f"{server.url}/predict", data=body, headers=headers, timeout=30)


def test_form_fields_and_uploads_without_a_filename(server: Server) -> None:
    """What curl sends for `-F top_k=2 -F 'image=<cat.jpg'`: top_k as a form field, the file with no filename."""
    boundary = "curl-like-boundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="top_k"\r\n\r\n2\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"\r\nContent-Type: image/jpeg\r\n\r\n'
        ).encode()
        + COFFEE
        + f"\r\n--{boundary}--\r\n".encode()
    )
    reply = post_multipart(server, boundary, body)
    assert reply.status_code == 200, reply.text
    (best,) = reply.json()["predictions"]
    assert len(best) == 2 and best[0]["label"] == "espresso"


def variants() -> dict[str, tuple[bytes, bytes]]:
    """name -> (odd encoding, its plain RGB equivalent)."""
    rgb = Image.open(io.BytesIO(CAT)).convert("RGB")
    gray = rgb.convert("L")
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display; so store it rotated 90 CCW
    rotated = encode(rgb.transpose(Image.Transpose.ROTATE_90), "JPEG", quality=95, exif=exif.tobytes())
    rgba = rgb.copy()
    rgba.putalpha(255)
    sixteen = Image.fromarray(np.asarray(gray).astype(np.uint16) * 257)  # 16-bit grey, full range
    return {
        "exif-rotated": (rotated, encode(rgb, "JPEG", quality=95)),
        "grayscale": (encode(gray, "PNG"), encode(gray.convert("RGB"), "PNG")),
        "rgba": (encode(rgba, "PNG"), encode(rgb, "PNG")),
        "cmyk": (encode(rgb.convert("CMYK"), "JPEG", quality=95), encode(rgb, "JPEG", quality=95)),
        "16-bit png": (encode(sixteen, "PNG"), encode(gray.convert("RGB"), "PNG")),
        "palette": (encode(rgb.quantize(256), "PNG"), encode(rgb.quantize(256).convert("RGB"), "PNG")),
    }


@pytest.mark.parametrize("name", ["exif-rotated", "grayscale", "rgba", "cmyk", "16-bit png", "palette"])
def test_odd_encodings_classify_like_their_rgb_source(server: Server, name: str) -> None:
    odd, plain = variants()[name]
    assert top1(server, odd) == top1(server, plain)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "BMP", "GIF", "TIFF"])
def test_every_accepted_format(server: Server, fmt: str) -> None:
    image = Image.open(io.BytesIO(COFFEE)).convert("RGB")
    assert top1(server, encode(image, fmt)) == "espresso"


def png_declaring(width: int, height: int) -> bytes:
    """A valid PNG header claiming width x height RGB pixels, with almost no data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_decompression_bomb_is_refused_without_decoding(server: Server) -> None:
    peaks = {pid: int(proc_status(pid)["VmHWM"].split()[0]) for pid in server.ready_workers()}
    for _ in range(4):  # enough to reach both workers
        reply = requests.post(f"{server.url}/predict", files={"image": png_declaring(40000, 40000)}, timeout=30)
        assert reply.status_code == 413
        assert "1600000000 pixels" in reply.json()["error"]
    for pid, before in peaks.items():
        after = int(proc_status(pid)["VmHWM"].split()[0])
        assert after - before < 50_000, f"worker {pid} peak RSS grew by {after - before} kB"


@pytest.mark.parametrize(
    ("files", "data", "headers", "status", "message"),
    [
        ({"image": b""}, None, None, 422, "empty"),
        ({"image": CAT[: len(CAT) // 2]}, None, None, 422, "truncated"),
        ({"image": b"<svg xmlns='http://www.w3.org/2000/svg'/>"}, None, None, 415, "is SVG, which is not supported"),
        ({"image": b"hello world, no picture"}, None, None, 415, "send JPEG, PNG, WebP, BMP, GIF or TIFF"),
        ({"photo": CAT}, None, None, 400, "no file in field 'image'"),
        (None, b"hello", {"Content-Type": "text/plain"}, 415, "Content-Type text/plain is not accepted"),
        ({"image": b"\0" * (11 * 1024 * 1024)}, None, None, 413, "the limit is 10485760 bytes"),
    ],
)
def test_bad_uploads(
    server: Server,
    files: dict[str, bytes] | None,
    data: bytes | None,
    headers: dict[str, str] | None,
    status: int,
    message: str,
) -> None:
    workers = server.workers()
    reply = requests.post(f"{server.url}/predict", files=files, data=data, headers=headers, timeout=30)
    assert reply.status_code == status, reply.text
    assert message in reply.json()["error"]
    assert server.workers() == workers


def test_too_many_images(server: Server) -> None:
    files = [("image", ("x.jpg", CAT, "image/jpeg"))] * 17
    reply = requests.post(f"{server.url}/predict", files=files, timeout=30)
    assert reply.status_code == 413 and "the limit is 16" in reply.json()["error"]


def test_chinese_labels_come_back_as_utf8(tmp_path: Path) -> None:
    model = channel_classifier(tmp_path / "tiny.onnx")
    labels = tmp_path / "labels.txt"
    labels.write_text("红色\n绿色\n蓝色\n", encoding="utf-8")
    settings = {
        "ONNXPOOL_MODEL__NAME": "colours",
        "ONNXPOOL_MODEL__PATH": str(model),
        "ONNXPOOL_TASK__LABELS": str(labels),
        "ONNXPOOL_TASK__PREPROCESS__RESIZE": "8",
        "ONNXPOOL_TASK__PREPROCESS__CROP": "8",
        "ONNXPOOL_TASK__PREPROCESS__MEAN": "[0, 0, 0]",
        "ONNXPOOL_TASK__PREPROCESS__STD": "[255, 255, 255]",
        "ONNXPOOL_SERVER__WORKERS": "1",
    }
    with running_server(tmp_path, settings, workers=1) as srv:
        blue = encode(Image.new("RGB", (32, 20), (10, 20, 240)), "PNG")
        reply = requests.post(f"{srv.url}/v2/models/colours/classify", files={"image": blue}, timeout=30)
        assert reply.status_code == 200
        assert reply.headers["Content-Type"].startswith("application/json")
        assert "蓝色".encode() in reply.content  # raw UTF-8, not \\u84dd escapes
        assert b"\\u" not in reply.content
        assert reply.json()["predictions"][0][0] == {"label": "蓝色", "index": 2, "score": pytest.approx(1.0, abs=0.01)}


def batch_histogram(server: Server) -> tuple[float, float]:
    """(count, sum) of onnxpool_inference_batch_size over all workers."""
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        for kind in ("count", "sum"):
            if line.startswith(f"onnxpool_inference_batch_size_{kind}{{"):
                values[kind] = float(line.rsplit(" ", 1)[1])
    return values.get("count", 0.0), values.get("sum", 0.0)


def test_three_images_run_as_one_inference_of_batch_3(server: Server) -> None:
    count, total = batch_histogram(server)
    predict(server, CAT, COFFEE, CAT)
    assert batch_histogram(server) == (count + 1, total + 3)


def test_multipart_parts_without_a_name_get_a_400(server: Server) -> None:
    """Found by schemathesis: a form part with no usable name made the error message itself fail."""
    boundary = "b0undary"
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data\r\n\r\nno name\r\n".encode()
        + f'--{boundary}\r\nContent-Disposition: form-data; name="x"\r\n\r\nnamed\r\n'.encode()
        + f'--{boundary}\r\nContent-Disposition: form-data; name="'.encode()
        + b'\xf4\x85\xb6\xba\xc3\xab\xc2\x92"\r\n\r\nodd bytes\r\n'
        + f"--{boundary}--\r\n".encode()
    )
    reply = post_multipart(server, boundary, body)
    assert reply.status_code == 400, reply.text
    assert "no file in field 'image'" in reply.json()["error"]
