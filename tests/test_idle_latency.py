"""bench.idle_latency: the PM QoS request is held only while measuring, and its absence is reported."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from onnxpool.measure import idle_latency


def test_measures_while_the_request_is_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    qos = tmp_path / "cpu_dma_latency"  # a plain file stands in for the device: same open/write
    qos.write_bytes(b"")
    monkeypatch.setattr(idle_latency, "PM_QOS_FILE", str(qos))
    assert idle_latency.measured_polling(lambda: qos.read_bytes()) == struct.pack("i", 0)


def test_without_the_device_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idle_latency, "PM_QOS_FILE", str(tmp_path / "missing"))
    result = idle_latency.measured_polling(lambda: pytest.fail("measured without the request"))
    assert result == f"not measured: {tmp_path / 'missing'} needs root"
