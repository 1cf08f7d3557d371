"""The master refuses to start on bad settings or a bad model: one line, non-zero exit, no worker forked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import start_and_collect


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"ONNXPOOL_SERVER__WORKERS": "abc"}, "server.workers = 'abc' (from env ONNXPOOL_SERVER__WORKERS)"),
        ({"ONNXPOOL_SERVER__WORKR": "2"}, "unknown setting in environment variable ONNXPOOL_SERVER__WORKR"),
        ({"ONNXPOOL_MODEL__PATH": "/nonexistent/model.onnx"}, "model file /nonexistent/model.onnx does not exist"),
        ({"ONNXPOOL_TASK__INPUT_NAME": "pixels"}, "task.input_name = 'pixels' is not an input"),
    ],
)
def test_bad_settings_stop_the_master(tmp_path: Path, settings: dict[str, str], expected: str) -> None:
    code, lines = start_and_collect(tmp_path, settings)
    assert code not in (0, None)
    assert lines == [lines[0]] and lines[0].startswith("onnxpool: error:"), lines
    assert expected in lines[0]


def test_corrupt_model_stops_the_master(tmp_path: Path) -> None:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07this is not a protobuf" * 50)
    code, lines = start_and_collect(tmp_path, {"ONNXPOOL_MODEL__PATH": str(bad)})
    assert code not in (0, None)
    assert len(lines) == 1 and f"model file {bad} cannot be loaded" in lines[0]
    assert "Booting worker" not in "\n".join(lines)


def test_labels_that_do_not_fit_the_model_stop_the_master(tmp_path: Path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\n")
    code, lines = start_and_collect(tmp_path, {"ONNXPOOL_TASK__LABELS": str(labels)})
    assert code not in (0, None)
    assert len(lines) == 1 and "has 2 labels but output 'logits' has 1000 classes" in lines[0]
