"""The copy workers serve (`[model] share_weights`): weights in one data file of the run folder that
every worker maps; the user's model file only ever read; models with external data of their own."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.harness import running_server
from tests.test_reload import first_logit, run_folder
from tests.tiny_models import CLASSES, build_tiny_model


def expected_first_logit(bias: float) -> float:
    """The tiny model's first logit for test_reload's input (every pixel 0.5)."""
    weights = np.linspace(-1.0, 1.0, 3 * CLASSES, dtype=np.float32).reshape(3, CLASSES)
    return float(0.5 * weights[:, 0].sum() + bias)


def fingerprint(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file of `folder`: its sha256 and its mtime (ns)."""
    return {
        path.name: (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
        for path in sorted(folder.iterdir())
        if path.is_file()
    }


def mapped_by(pid: int, path: Path) -> bool:
    return str(path) in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("own_external_data", [False, True])
def test_workers_map_one_data_file_and_the_users_files_are_untouched(tmp_path: Path, own_external_data: bool) -> None:
    user = tmp_path / "user"
    user.mkdir()
    model = build_tiny_model(user / "model.onnx", bias=0.5)
    if own_external_data:  # weights beside the model, as large exports ship
        proto = onnx.load(str(model))
        onnx.save(proto, str(model), save_as_external_data=True, location="weights.bin", size_threshold=0)
    before = fingerprint(user)
    settings = {"ONNXPOOL_MODEL__PATH": str(model), "ONNXPOOL_SERVER__WORKERS": "2"}
    with running_server(tmp_path, settings, workers=2) as srv:
        assert first_logit(srv) == pytest.approx(expected_first_logit(0.5), abs=1e-4)
        copies = list((run_folder(srv) / "models").glob("*/model.onnx"))
        assert len(copies) == 1
        data = copies[0].with_name("model.onnx.data")
        assert data.is_file() and not list(copies[0].parent.glob("*.bytes"))  # the byte copy is gone
        assert all(mapped_by(pid, data) for pid in srv.workers())  # one file, mapped by every worker
        assert not (copies[0].parent / "weights.bin").exists()  # written from the user's files where they are
    assert fingerprint(user) == before


def test_share_weights_off_serves_a_byte_copy(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model.onnx", bias=0.0)
    settings = {"ONNXPOOL_MODEL__PATH": str(model), "ONNXPOOL_MODEL__SHARE_WEIGHTS": "false"}
    with running_server(tmp_path, settings, workers=1) as srv:
        copies = list((run_folder(srv) / "models").glob("*/*"))
        assert [c.name for c in copies] == ["model.onnx.bytes"]
        assert copies[0].read_bytes() == model.read_bytes()
        assert first_logit(srv) == pytest.approx(expected_first_logit(0.0), abs=1e-4)
