"""Image-endpoint requests whose replies were recorded, byte for byte, before the endpoint became a task.

`python -m tests.image_replies --record` starts a real server (demo model, response cache off)
and writes every case's status, content type and body to tests/fixtures/image_replies.json;
tests/test_task_image_wire.py sends the same requests to today's code and compares. The
recording was made from the code as it was before image classification became a task, so the
comparison proves the change left the wire alone. Every case is built here, deterministically:
the two sample photos, re-encoded into other formats and sizes, several per request, top_k
variants, both URLs, both body shapes, and requests that are refused.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import requests
from PIL import Image

from tests.harness import DATA, MODEL_NAME, running_server

RECORDING = Path(__file__).resolve().parent / "fixtures" / "image_replies.json"
CLASSIFY = f"/v2/models/{MODEL_NAME}/classify"


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    params: dict[str, str]
    files: list[tuple[str, tuple[str, bytes, str]]] | None = None
    body: bytes | None = None
    content_type: str | None = None

    def send(self, base_url: str) -> requests.Response:
        headers = {"Content-Type": self.content_type} if self.content_type else {}
        return requests.post(
            base_url + self.path, params=self.params, files=self.files, data=self.body, headers=headers, timeout=60
        )


def _encode(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


def photos() -> dict[str, bytes]:
    """The sample photos and deterministic variants of them (formats, sizes, modes)."""
    cat = (DATA / "chelsea-cat.jpg").read_bytes()
    coffee = (DATA / "coffee.jpg").read_bytes()
    out = {"cat.jpg": cat, "coffee.jpg": coffee}
    for name, data in (("cat", cat), ("coffee", coffee)):
        image = Image.open(io.BytesIO(data)).convert("RGB")
        out[f"{name}.png"] = _encode(image, "PNG")
        out[f"{name}-small.bmp"] = _encode(image.resize((97, 61)), "BMP")
        out[f"{name}-grey.png"] = _encode(image.convert("L"), "PNG")
        out[f"{name}-rgba.webp"] = _encode(image.convert("RGBA"), "WEBP")
        out[f"{name}-tall.tiff"] = _encode(image.resize((120, 300)), "TIFF")
        out[f"{name}-flipped.gif"] = _encode(image.transpose(Image.Transpose.FLIP_LEFT_RIGHT), "GIF")
    return out


def cases() -> Iterator[Case]:
    images = photos()
    for name, data in images.items():
        yield Case(f"raw {name}", "/predict", {}, body=data, content_type="image/octet")
    for k in ("1", "3", "1000", "2000"):
        files = [("image", ("cat.jpg", images["cat.jpg"], "image/jpeg"))]
        yield Case(f"multipart top_k={k}", "/predict", {"top_k": k}, files=files)
        yield Case(f"classify top_k={k}", CLASSIFY, {"top_k": k}, files=files)
    batch = [("image", (name, data, "application/octet-stream")) for name, data in images.items()]
    yield Case("multipart batch of all", "/predict", {"top_k": "2"}, files=batch[:14])
    yield Case("multipart top_k as field", "/predict", {}, files=[*batch[:2], ("top_k", ("", b"4", "text/plain"))])
    yield Case("raw classify coffee", CLASSIFY, {"top_k": "3"}, body=images["coffee.jpg"], content_type="image/jpeg")
    # refused: the error replies must not change either
    yield Case("top_k zero", "/predict", {"top_k": "0"}, body=images["cat.jpg"], content_type="image/jpeg")
    yield Case("top_k text", "/predict", {"top_k": "many"}, body=images["cat.jpg"], content_type="image/jpeg")
    yield Case("not an image", "/predict", {}, body=b"hello, not a picture", content_type="image/jpeg")
    yield Case("text body", "/predict", {}, body=b"hello", content_type="text/plain")
    yield Case("no content type", "/predict", {}, body=b"hello")
    yield Case("truncated jpeg", "/predict", {}, body=images["cat.jpg"][:3000], content_type="image/jpeg")
    yield Case("wrong field", "/predict", {}, files=[("photo", ("cat.jpg", images["cat.jpg"], "image/jpeg"))])
    yield Case("unknown model", "/v2/models/nope/classify", {}, body=images["cat.jpg"], content_type="image/jpeg")
    yield Case("too many images", "/predict", {}, files=batch[:1] * 17)


def record(base_url: str) -> dict[str, dict[str, str | int]]:
    return {case.name: as_recorded(case.send(base_url)) for case in cases()}


def as_recorded(reply: requests.Response) -> dict[str, str | int]:
    """A reply as a recording keeps it: status, content type and the body's bytes (base64)."""
    return {
        "status": reply.status_code,
        "content_type": reply.headers.get("Content-Type", ""),
        "body": base64.b64encode(reply.content).decode(),
    }


def recording_command(doc: str, recording: Path, record_in: Callable[[Path], dict[str, dict[str, str | int]]]) -> None:
    """`python -m tests.<x>_replies --record`: `record_in(a temporary folder)`'s replies written to `recording`."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--record", action="store_true", help="(re)write the recording from servers of this code")
    if not parser.parse_args().record:
        parser.error("nothing to do without --record")
    with tempfile.TemporaryDirectory() as tmp:
        recorded = record_in(Path(tmp))
    recording.parent.mkdir(parents=True, exist_ok=True)
    recording.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(recorded)} replies in {recording}")


def record_from_server(root: Path) -> dict[str, dict[str, str | int]]:
    """Every case's reply from a fresh server of this code (demo model, response cache off)."""
    with running_server(root, {"ONNXPOOL_SERVER__WORKERS": "2", "ONNXPOOL_CACHE__ENABLED": "false"}) as srv:
        return record(srv.url)


if __name__ == "__main__":
    recording_command(__doc__ or "", RECORDING, record_from_server)
