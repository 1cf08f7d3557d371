"""Request bodies for the load generator, built ONCE before any request is sent.

The load generator sends the same prepared bytes over and over, so its own CPU
cost per request is one HTTP exchange, not JSON or multipart encoding. Three
modes: v2 binary tensors, v2 JSON tensors, and `/predict` with an image file.
The v2 bodies come from the server's own client codec (`encode_infer_request`).
"""

from __future__ import annotations

import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import requests

from onnxpool.server.datatypes import V2_TO_NUMPY

Mode = Literal["v2-binary", "v2-json", "predict"]
MODES: tuple[Mode, ...] = ("v2-binary", "v2-json", "predict")


@dataclass(frozen=True)
class PreparedRequest:
    """One HTTP request, ready to be sent as is: method, path, headers, body."""

    method: str
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    items: int = 1
    """Images / batch rows in one request (requests/s x items = items/s)."""


@dataclass(frozen=True)
class InputSpec:
    """An input tensor as the server's v2 model metadata describes it."""

    name: str
    datatype: str
    shape: tuple[int, ...]


def fetch_inputs(base_url: str, model: str, timeout: float = 10.0) -> list[InputSpec]:
    """The model's inputs from `GET /v2/models/{model}` (names, datatypes, shapes with -1)."""
    url = f"{base_url.rstrip('/')}/v2/models/{urllib.parse.quote(model)}"
    reply = requests.get(url, timeout=timeout)
    if reply.status_code != 200:
        raise ValueError(f"GET {url} answered {reply.status_code}: {reply.text[:200]}")
    meta: dict[str, Any] = reply.json()
    return [InputSpec(i["name"], i["datatype"], tuple(int(d) for d in i["shape"])) for i in meta["inputs"]]


def concrete_shape(shape: tuple[int, ...], batch: int) -> tuple[int, ...]:
    """Dynamic dims: the first one becomes `batch`, any others 1."""
    dims = [batch if (axis == 0 and d < 0) else (1 if d < 0 else d) for axis, d in enumerate(shape)]
    return tuple(dims)


def random_tensor(spec: InputSpec, batch: int, seed: int = 0) -> np.ndarray:
    """Deterministic random data of the input's datatype and (concrete) shape."""
    dtype = V2_TO_NUMPY.get(spec.datatype)
    if dtype is None:
        raise ValueError(f"input '{spec.name}' has datatype {spec.datatype}; bench supports numeric tensors only")
    rng = np.random.default_rng(seed)
    dims = concrete_shape(spec.shape, batch)
    if dtype.kind == "f":
        return rng.standard_normal(dims).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, dims).astype(dtype)
    return rng.integers(0, min(100, np.iinfo(dtype).max), dims).astype(dtype)


# A bench run sends ONE payload over and over; the response cache would answer all but the
# first, and the run would measure the cache instead of the model. These requests bypass it
# (neither read nor written); `--repeat-fraction` (measure/repeats.py) measures the cache.
BYPASS_CACHE = {"Cache-Control": "no-store"}


def infer_path(model: str) -> str:
    return f"/v2/models/{urllib.parse.quote(model)}/infer"


def _v2_request(model: str, inputs: list[InputSpec], batch: int, binary: bool) -> PreparedRequest:
    # Imported here, not at the top: every spawned load-generator process imports this
    # module (to unpickle PreparedRequest) but never encodes, and each import delays the
    # moment it can start sending (a short bench step was seen to end before it did).
    from onnxpool.server.v2codec import encode_infer_request

    tensors = {spec.name: random_tensor(spec, batch, seed=i) for i, spec in enumerate(inputs)}
    if binary:
        encoded = encode_infer_request(tensors, set(tensors), binary_output=True)
    else:
        # The float text (so the server's parse cost) of a plain Python client:
        # tritonclient and friends write `tensor.tolist()` with json.dumps.
        encoded = encode_infer_request(tensors, python_floats=True)
    return PreparedRequest("POST", infer_path(model), encoded.body, {**encoded.headers, **BYPASS_CACHE}, batch)


def v2_binary_request(model: str, inputs: list[InputSpec], batch: int) -> PreparedRequest:
    """v2 infer with the binary tensor data extension, asking for binary outputs too."""
    return _v2_request(model, inputs, batch, binary=True)


def v2_json_request(model: str, inputs: list[InputSpec], batch: int) -> PreparedRequest:
    """v2 infer with JSON tensors (flat data lists), as a plain JSON client sends it."""
    return _v2_request(model, inputs, batch, binary=False)


def multipart_body(field_name: str, files: list[tuple[str, bytes, str]]) -> tuple[bytes, str]:
    """A multipart/form-data body with one part per file; returns (body, content type)."""
    boundary = f"onnxpool-bench-{uuid.uuid4().hex}"
    parts: list[bytes] = []
    for filename, data, content_type in files:
        head = (
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="{field_name}"; filename="{filename}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n"
        )
        parts += [head.encode(), data, b"\r\n"]
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


IMAGE_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp"}


def predict_request(image: Path, batch: int, path: str = "/predict") -> PreparedRequest:
    """`POST /predict` with `batch` copies of the image in the multipart field `image`."""
    data = image.read_bytes()
    content_type = IMAGE_TYPES.get(image.suffix.lower(), "application/octet-stream")
    body, body_type = multipart_body("image", [(image.name, data, content_type)] * batch)
    return PreparedRequest("POST", path, body, {"Content-Type": body_type, **BYPASS_CACHE}, batch)


def prepare(
    mode: Mode,
    base_url: str,
    *,
    model: str,
    batch: int = 1,
    image: Path | None = None,
    predict_path: str = "/predict",
) -> PreparedRequest:
    """The one request a bench run repeats, for `mode` (asks the server for the model's inputs)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if mode == "predict":
        if image is None:
            raise ValueError("mode 'predict' needs an image file (--image)")
        return predict_request(image, batch, predict_path)
    inputs = fetch_inputs(base_url, model)
    if mode == "v2-binary":
        return v2_binary_request(model, inputs, batch)
    return v2_json_request(model, inputs, batch)
