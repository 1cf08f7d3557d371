"""What one request costs outside inference: gunicorn's floor vs onnxpool with a 1 ms model.

Starts, one after the other (never side by side), 2 sync workers each of
  1. a bare WSGI app that only reads the body and replies (benchmarks/baselines/floor_wsgi.py),
  2. onnxpool serving a tiny model (about 0.1 ms of inference),
and drives both with the same v2 binary request (1x3x224x224 FP32, 602 KB) at
concurrency 4. ms per request per worker = workers / (requests/s): the gap
between them is onnxpool's own overhead (Flask, validation, metrics); the floor
is what any gunicorn sync server pays here.

    .venv/bin/python -m benchmarks.floor --duration 10
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import REPO
from onnxpool.measure.loadgen import LoadGenerator, StepPlan
from onnxpool.measure.payloads import PreparedRequest
from onnxpool.measure.servers import Server, free_port, start_command, start_server
from onnxpool.server.v2codec import encode_infer_request


def _request() -> PreparedRequest:
    x = np.zeros((1, 3, 224, 224), dtype=np.float32)
    encoded = encode_infer_request({"input": x}, {"input"}, binary_output=True)
    return PreparedRequest("POST", "/v2/models/efficientnet-lite0/infer", encoded.body, encoded.headers)


def start_floor_app(folder: Path, workers: int, reply_bytes: int = 4000) -> Server:
    """The bare WSGI app (benchmarks/baselines/floor_wsgi.py) under `workers` gunicorn sync workers, on loopback."""
    port = free_port()
    argv = [sys.executable, "-m", "gunicorn", "-w", str(workers), "-b", f"127.0.0.1:{port}", "--no-control-socket"]
    app = "benchmarks.baselines.floor_wsgi:app"
    env = {"FLOOR_REPLY_BYTES": str(reply_bytes)}
    return start_command([*argv, app], folder, port, "/", env=env, name="floor", cwd=REPO)


def _measure(url: str, duration: float) -> tuple[float, float]:
    with LoadGenerator(url, _request(), 4) as generator:
        step = generator.run_step(StepPlan(4, 1.0, duration))
    if step.ok != step.requests:
        raise SystemExit(f"{url}: {step.requests - step.ok} of {step.requests} requests failed")
    return step.throughput, step.client_cpu_per_request


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per server")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="onnxpool-floor-") as tmp:
        folder = Path(tmp)
        print("1/2 bare gunicorn app ...", file=sys.stderr)
        bare = start_floor_app(folder, 2)
        try:
            rows.append(("bare gunicorn sync app", *_measure(bare.url, args.duration)))
        finally:
            bare.stop()
        print("2/2 onnxpool with a tiny model ...", file=sys.stderr)
        from tests.tiny_models import build_tiny_model

        model = build_tiny_model(folder / "tiny.onnx", bias=0.0)
        settings = {"ONNXPOOL_MODEL__PATH": str(model), "ONNXPOOL_SERVER__WORKERS": "2"}
        settings["ONNXPOOL_LOGGING__ACCESS_LOG"] = "false"
        server = start_server(folder, settings, workers=2)
        try:
            rows.append(("onnxpool, tiny model", *_measure(server.url, args.duration)))
        finally:
            server.stop()
    print(f"\nv2 binary request (602 KB), concurrency 4, 2 sync workers, {args.duration:.0f} s each")
    print(f"{'server':<26}{'req/s':>9}{'ms/request/worker':>19}{'client cpu ms/req':>19}")
    for name, rate, client in rows:
        print(f"{name:<26}{rate:>9.0f}{2000 / rate:>19.2f}{client * 1000:>19.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
