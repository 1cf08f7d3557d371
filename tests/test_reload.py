"""HUP re-reads everything: a good model or settings file is served by the new workers, a broken one refused."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import requests

from tests.harness import DATA, MODEL_NAME, Server, running_server
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

        copies = run_folder(srv) / "models"
        first = served_copies(copies)
        assert len(first) == 1 and (first[0].parent / "model.onnx.data").is_file()  # the mapped form

        broken = tmp_path / "broken.onnx"
        broken.write_bytes(b"\x08\x07 half-written file" * 100)
        os.replace(broken, model)
        hup_and_wait(srv, 2)
        assert "reload: keeping the running configuration and the last good model" in srv.log()
        assert first_logit(srv) == base  # the new workers loaded the last good copy and serve
        assert served_copies(copies) == first  # the refused file's copy is gone, the last good one kept

        fresh = build_tiny_model(tmp_path / "next.onnx", bias=1.0)
        os.replace(fresh, model)
        hup_and_wait(srv, 2)
        assert abs(first_logit(srv) - (base + 1.0)) < 1e-4
        second = served_copies(copies)
        assert len(second) == 1 and second != first  # swapped: the old generation's folder removed
        assert srv.process.poll() is None


def served_copies(models: Path) -> list[Path]:
    """The served forms in the run folder's models/ (each in a folder of its own), besides nothing else."""
    assert all(folder.is_dir() for folder in models.iterdir())
    return sorted(models.glob("*/model.onnx"))


def run_folder(server: Server) -> Path:
    found = re.search(r"run folder: (\S+)", server.log())
    assert found, server.log()
    return Path(found.group(1))


def write_labels(path: Path, prefix: str) -> None:
    path.write_text("".join(f"{prefix}{i}\n" for i in range(1000)), encoding="utf-8")


def write_settings(path: Path, model: Path, labels: Path, top_k: int, extra: str = "") -> None:
    path.write_text(
        f'[model]\npath = "{model}"\nwarmup_runs = 1\n[task]\nlabels = "{labels}"\ntop_k = {top_k}\n{extra}',
        encoding="utf-8",
    )


def predict(server: Server, headers: dict[str, str] | None = None) -> requests.Response:
    with (DATA / "chelsea-cat.jpg").open("rb") as photo:
        return requests.post(server.url + "/predict", files={"image": photo}, headers=headers, timeout=30)


def labels_of(reply: requests.Response) -> list[str]:
    assert reply.status_code == 200, reply.text
    return [p["label"] for p in reply.json()["predictions"][0]]


def test_hup_applies_every_setting_and_keeps_the_last_good_ones(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model.onnx", bias=0.0)
    labels, config = tmp_path / "labels.txt", tmp_path / "onnxpool.toml"
    write_labels(labels, "old-")
    write_settings(config, model, labels, top_k=3)
    with running_server(tmp_path, {"ONNXPOOL_SERVER__WORKERS": "2"}, workers=2, config=config) as srv:
        before = labels_of(predict(srv))
        assert len(before) == 3 and all(name.startswith("old-") for name in before)

        # New labels, a new top_k default and an API key: all applied by a HUP, no restart.
        write_labels(labels, "new-")
        key = "k" * 24
        write_settings(config, model, labels, top_k=2, extra=f'[auth]\napi_keys = ["{key}"]\n')
        hup_and_wait(srv, 2)
        assert predict(srv).status_code == 401
        after = labels_of(predict(srv, {"Authorization": f"Bearer {key}"}))
        assert after == [name.replace("old-", "new-") for name in before[:2]]

        # A broken settings file, then a labels file that no longer fits the model: both refused.
        config.write_text("[model\ntop_k = 7\n", encoding="utf-8")
        hup_and_wait(srv, 2)
        labels.write_text("only\nthree\nlabels\n", encoding="utf-8")
        write_settings(config, model, labels, top_k=5)
        hup_and_wait(srv, 2)
        assert srv.log().count("reload: keeping the running configuration") == 2
        assert labels_of(predict(srv, {"Authorization": f"Bearer {key}"})) == after
        assert srv.process.poll() is None
