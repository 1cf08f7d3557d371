"""HUP with a new model file: a good file is served by the new workers, a broken one is refused."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import requests

from tests.harness import MODEL_NAME, Server, running_server
from tests.tiny_models import build_tiny_model
from tests.v2client import binary_infer, parse_binary_reply

X = np.full((1, 3, 224, 224), 0.5, dtype=np.float32)


def first_logit(server: Server) -> float:
    call = binary_infer(MODEL_NAME, X)
    reply = requests.post(server.url + call.path, data=call.body, headers=call.headers, timeout=30)
    return float(parse_binary_reply(reply, call.output)[0, 0])


def hup_and_wait(server: Server, workers: int) -> None:
    old = set(server.ready_workers())
    server.signal(signal.SIGHUP)
    server.wait_ready(workers, timeout=60, exclude=old)
    deadline = time.monotonic() + 30
    while set(server.workers()) & old and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(server.workers()) & old, "old workers still running"


def test_hup_loads_a_good_new_file_and_refuses_a_broken_one(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    build_tiny_model(model, bias=0.0)
    settings = {"ONNXPOOL_MODEL__PATH": str(model), "ONNXPOOL_SERVER__WORKERS": "2"}
    with running_server(tmp_path, settings, workers=2) as srv:
        base = first_logit(srv)

        broken = tmp_path / "broken.onnx"
        broken.write_bytes(b"\x08\x07 half-written file" * 100)
        os.replace(broken, model)
        hup_and_wait(srv, 2)
        assert "reload: keeping the running configuration and the last good model" in srv.log()
        assert first_logit(srv) == base  # the new workers loaded the last good copy and serve

        fresh = build_tiny_model(tmp_path / "next.onnx", bias=1.0)
        os.replace(fresh, model)
        hup_and_wait(srv, 2)
        assert abs(first_logit(srv) - (base + 1.0)) < 1e-4
        assert srv.process.poll() is None
