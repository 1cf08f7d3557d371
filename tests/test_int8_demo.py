"""The shipped INT8 demo model: served by a REAL server like the float one, and `limit --compare`."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from onnxpool.cli import main
from onnxpool.config.loader import CONFIG_DIR, config_file_named, load_settings
from onnxpool.measure.paths import DEMO_MODEL
from onnxpool.tasks.image.settings import image_settings
from onnxpool.workers.cpu_fit import CPUINFO_ENV
from tests.harness import DATA, running_server
from tests.test_quantize_targets import AVX2_HOST, VNNI_HOST, cpuinfo

INT8 = "efficientnet-lite0-int8"
CAT_CLASSES = {"tabby", "tiger cat", "Egyptian cat", "Persian cat", "Siamese cat"}


def test_shipped_config_by_name() -> None:
    assert config_file_named(INT8) == CONFIG_DIR / f"{INT8}.toml"
    assert config_file_named("no-such-config") == Path("no-such-config")  # then: "does not exist"
    settings = load_settings(INT8).settings
    assert settings.model.name == INT8
    assert Path(settings.model.path).is_file() and Path(settings.model.path).parent.name == INT8
    assert image_settings(load_settings(INT8)).preprocess == image_settings(load_settings()).preprocess  # calibrated


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "built_for"),
    [(VNNI_HOST, ("avx512-vnni", False, "model-vnni.onnx")), (AVX2_HOST, ("portable", True, "model.onnx"))],
    ids=["vnni-cpu", "avx2-cpu"],
)
def test_int8_demo_is_served_like_the_float_model(
    tmp_path: Path, flags: frozenset[str], built_for: tuple[str, bool, str]
) -> None:
    settings = {"ONNXPOOL_SERVER__WORKERS": "1", CPUINFO_ENV: str(cpuinfo(tmp_path, flags))}
    with running_server(tmp_path, settings, workers=1, config=Path(INT8)) as server:
        meta = requests.get(f"{server.url}/v2/models/{INT8}", timeout=10).json()
        assert meta["inputs"][0]["datatype"] == "FP32" and meta["outputs"][0]["shape"] == [-1, 1000]
        # the VNNI build on a CPU with VNNI, the portable one (7-bit weights) elsewhere; right either way
        q = meta["parameters"]["quantization"]
        target, reduce_range, file = built_for
        assert (q["target"], q["reduce_range"], q["cpu_fit"]) == (target, reduce_range, "ok")
        assert f"model file: {Path(load_settings(INT8).settings.model.path).parent / file} (" in server.log()
        files = {"image": ("cat.jpg", (DATA / "chelsea-cat.jpg").read_bytes(), "image/jpeg")}
        reply = requests.post(f"{server.url}/predict", files=files, params={"top_k": 1}, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == INT8
        assert reply.json()["predictions"][0][0]["label"] in CAT_CLASSES
        metrics = requests.get(f"{server.url}/metrics", timeout=10).text
        labels = (
            f'cache="miss",endpoint="/predict",model="{INT8}",protocol="http",status="200",task="image-classification"'
        )
        assert f"onnxpool_requests_total{{{labels}}} 1.0" in metrics
        assert "onnxpool_model_warmup_seconds" in metrics


def test_limit_compares_fp32_and_int8_in_one_run(capsys: pytest.CaptureFixture[str]) -> None:
    int8 = Path(load_settings(INT8).settings.model.path)
    argv = ["limit", str(DEMO_MODEL), "--compare", str(int8), "--pipeline", "raw", "--workers", "1"]
    code = main([*argv, "--threads-per-worker", "1", "--duration", "0.3", "--warmup", "0.1", "--rounds", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "x model.onnx" in out and str(int8) in out and "median of 2 alternating rounds" in out


@pytest.mark.slow
def test_tune_runs_on_the_int8_model(capsys: pytest.CaptureFixture[str]) -> None:
    # in-process layouts of the INT8 model, then one real server confirming the best over HTTP
    code = main(["tune", "--config", INT8, "--budget", "20s", "--batches", "1", "--top", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "recommended: workers =" in captured.out
    assert str(Path(load_settings(INT8).settings.model.path)) in captured.out + captured.err
