"""The HTTP layer's own cost per request, inference stubbed: for comparing two versions of the code.

Builds the app in process as the gunicorn master does and sends N requests of one kind
(`predict`: the cat JPEG as multipart; `v2-binary`: a 1x3x224x224 binary tensor) through
the whole WSGI stack (middleware, checks, route, codecs, postprocessing), with a backend
that returns fixed logits instead of running the model. Wall time is printed, but on a
shared machine compare instruction counts, which do not drift with load:

    for n in 10 30; do valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python -m benchmarks.hotpath predict $n; done   # (Ir@30 - Ir@10) / 20

`--tree DIR --old-layout` runs a checkout from before the one-namespace restructure
(top-level `server`, `config`, `workers`) with the same requests.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from onnxpool.measure.paths import CAT_JPEG
from onnxpool.server.backend import NoBoard

LOGITS = np.linspace(-3, 3, 1000, dtype=np.float32)
BOUNDARY = "onnxpool-hotpath"


def build_app(tree: Path | None, old_layout: bool) -> Callable[..., Iterable[bytes]]:
    """The app of `tree` (or the installed onnxpool) around a stub backend, metrics on, cache off."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="onnxpool-hotpath-")
    if tree is not None:
        sys.path.insert(0, str(tree))
    prefix = "" if old_layout else "onnxpool."
    loader = __import__(f"{prefix}config.loader", fromlist=["load_settings"])
    app_module = __import__(f"{prefix}server.app", fromlist=["create_app"])
    info_module = __import__(f"{prefix}workers.model_info", fromlist=["ModelInfo"])
    overrides = {} if old_layout else {"cache.enabled": False}
    settings = loader.load_settings(overrides=overrides).settings
    spec = info_module.TensorSpec
    info = info_module.ModelInfo(
        inputs=(spec("input", "tensor(float)", (-1, 3, 224, 224)),),
        outputs=(spec("logits", "tensor(float)", (-1, 1000)),),
    )

    class StubBackend(NoBoard):
        ready = True

        @property
        def info(self) -> Any:
            return info

        def infer(self, feeds: Mapping[str, np.ndarray], output_names: object = None) -> dict[str, np.ndarray]:
            batch = next(iter(feeds.values())).shape[0]
            return {"logits": np.tile(LOGITS, (batch, 1))}

    app: Callable[..., Iterable[bytes]] = app_module.create_app(settings, StubBackend())
    return app


def request_of(kind: str) -> tuple[str, bytes, dict[str, str]]:
    """Path, body and headers, written out by hand so both versions get the same bytes."""
    if kind == "predict":
        head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="cat.jpg"\r\n'
        body = (head + "Content-Type: image/jpeg\r\n\r\n").encode() + CAT_JPEG.read_bytes()
        body += f"\r\n--{BOUNDARY}--\r\n".encode()
        return "/predict", body, {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    x = np.zeros((1, 3, 224, 224), np.float32)
    tensor = {"name": "input", "datatype": "FP32", "shape": list(x.shape), "parameters": {"binary_data_size": x.nbytes}}
    header = json.dumps(
        {
            "inputs": [tensor],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}
    return "/v2/models/efficientnet-lite0/infer", header + x.tobytes(), headers


def environ_of(path: str, body: bytes, headers: Mapping[str, str]) -> dict[str, Any]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "CONTENT_LENGTH": str(len(body)),
    }
    for name, value in headers.items():
        key = name.upper().replace("-", "_")
        environ[key if key == "CONTENT_TYPE" else f"HTTP_{key}"] = value
    return environ


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hotpath", description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["predict", "v2-binary"])
    parser.add_argument("requests", type=int)
    parser.add_argument("--tree", type=Path, help="another checkout to measure instead of the installed onnxpool")
    parser.add_argument("--old-layout", action="store_true", help="--tree predates the one-namespace layout")
    args = parser.parse_args()
    app = build_app(args.tree, args.old_layout)
    path, body, headers = request_of(args.kind)

    def call() -> None:
        statuses: list[str] = []
        reply = b"".join(app(environ_of(path, body, headers), lambda status, *_: statuses.append(status)))
        if not statuses or not statuses[0].startswith("200"):
            raise SystemExit(f"{statuses}: {reply[:200]!r}")

    call()  # first request: lazy imports and caches
    start = time.perf_counter()
    for _ in range(args.requests):
        call()
    elapsed = time.perf_counter() - start
    print(f"{args.kind}: {elapsed / max(1, args.requests) * 1000:.3f} ms/request (wall, in process)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
