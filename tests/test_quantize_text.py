"""`onnxpool quantize` of a text-embedding model (issue 24): dynamic INT8, judged by cosine per target.

On the tiny random BERT of tests/text_models.py with the real tokenizer: the CLI end to end,
the recipe inside the model and back through the server, the search keeping MatMuls float,
and every refusal as one line with exit code 2. The real MiniLM is made by `make minilm-int8`.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import numpy as np
import onnx
import openai
import pytest
import requests

from benchmarks.text_sentences import sentences
from onnxpool.cli import main
from onnxpool.quantize.errors import QuantizeError
from onnxpool.quantize.report import report_path
from onnxpool.quantize.targets import find_qemu
from onnxpool.quantize.text import ReplayRunner, compare_embeddings, read_sentences
from onnxpool.workers.cpu_fit import CPUINFO_ENV, ModelRecipe
from tests.harness import running_server
from tests.test_quantize import one_error_line
from tests.test_quantize_targets import VNNI_HOST, cpuinfo
from tests.test_text_tasks import KEY, MODEL, settings_file
from tests.text_models import build_classifier_folder, build_text_model_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = build_text_model_folder(tmp_path_factory.mktemp("qtext") / "model")
    settings_file(folder, "text-embedding", "truncate = true\n")
    texts = sentences()
    (folder / "search.json").write_text(json.dumps(texts[0:60:2]))
    (folder / "eval.json").write_text(json.dumps(texts[1:60:2]))
    return folder


def quantize(folder: Path, out: Path, *extra: str) -> int:
    argv = ["quantize", "--config", str(folder / "onnxpool.toml"), "-o", str(out), "--quiet", "--speed-seconds=0"]
    if "--eval" not in extra:
        argv += ["--eval", str(folder / "eval.json")]
    if "--target" not in extra:
        argv += ["--target", "host"]
    return main([*argv, *extra])


def test_made_judged_and_served(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = folder / "model-int8.onnx"
    code = quantize(folder, out, "--calibration", str(folder / "search.json"), "--min-cosine", "0.5")
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads(report_path(out).read_text())
    assert report["kind"] == "text-embedding" and report["recipe"]["quant_format"] == "dynamic"
    host = report["targets"]["host"]
    assert host["judged"] == "native" and host["similarity"]["n"] == 30
    assert 0.5 <= host["similarity"]["mean_cosine"] <= 1.0
    assert 0.0 <= host["similarity"]["retrieval_top10_overlap"] <= 1.0
    assert report["sentences"]["judged_on"] == "eval (held out)" and report["sentences"]["search"]["n"] == 30
    assert "mean cosine" in printed and "top-10 retrieval overlap" in printed
    model = onnx.load(str(out))
    ops = {n.op_type for n in model.graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops  # weights INT8, inputs quantized per run
    recipe = ModelRecipe.from_metadata({p.key: p.value for p in model.metadata_props})
    assert recipe is not None and recipe.target == "host" and recipe.version
    # The server reads the recipe back (without onnxruntime in the master) and serves the INT8 model.
    (folder / "int8.toml").write_text(
        (folder / "onnxpool.toml").read_text().replace('path = "model.onnx"', 'path = "model-int8.onnx"')
    )
    with running_server(tmp_path, {"ONNXPOOL_SERVER__WORKERS": "1"}, config=folder / "int8.toml", workers=1) as srv:
        meta = requests.get(f"{srv.url}/v2/models/{MODEL}", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        assert meta.json()["parameters"]["quantization"]["target"] == "host"
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
        reply = client.embeddings.create(model=MODEL, input=["A man is eating food.", ""])
        vectors = np.array([d.embedding for d in reply.data])
        assert vectors.shape[0] == 2 and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)


def test_the_search_keeps_matmuls_float_until_the_budget_holds(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "strict.onnx"
    plain = tmp_path / "plain.onnx"
    assert quantize(folder, plain, "--min-cosine", "0") == 0
    reached = json.loads(report_path(plain).read_text())["targets"]["host"]["similarity"]["mean_cosine"]
    assert reached < 1.0
    budget = f"{(reached + 1.0) / 2:.6f}"  # between all-INT8 and FP32: only float MatMuls can reach it
    code = quantize(folder, out, "--min-cosine", budget, "--max-float", "64")
    assert code == 0
    report = json.loads(report_path(out).read_text())
    assert report["float_layers"] and report["targets"]["host"]["similarity"]["mean_cosine"] >= float(budget)
    excluded = set(report["float_layers"])
    assert {n.name for n in onnx.load(str(out)).graph.node if n.op_type == "MatMul"} >= excluded


def test_refusals_are_one_line(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "never.onnx"
    assert main(["quantize", "--config", str(folder / "onnxpool.toml"), "-o", str(out), "--quiet"]) == 2
    assert "--eval FILE" in one_error_line(capsys)
    (tmp_path / "few.json").write_text(json.dumps(["one", "two"]))
    assert quantize(folder, out, "--eval", str(tmp_path / "few.json")) == 2
    assert "has 2 sentences; at least 11" in one_error_line(capsys)
    assert quantize(folder, out, "--min-cosine", "1", "--max-float", "1") == 2
    assert "no candidate met --min-cosine 1.0 with up to 1 float MatMuls" in one_error_line(capsys)
    assert quantize(folder, out, "--exclude", "/nope/MatMul") == 2
    assert "--exclude '/nope/MatMul'" in one_error_line(capsys)
    assert quantize(folder, out, "--target", "avx9") == 2
    assert "unknown --target 'avx9'" in one_error_line(capsys)
    assert not out.exists()
    classifier = build_classifier_folder(tmp_path / "classifier")
    settings_file(classifier, "text-classification")
    assert main(["quantize", "--config", str(classifier / "onnxpool.toml"), "-o", str(out), "--quiet"]) == 2
    assert "task is 'text-classification'" in one_error_line(capsys)


def test_sentence_files_and_similarity(tmp_path: Path) -> None:
    lines = tmp_path / "s.txt"
    lines.write_text("\n".join(f"sentence {i}" for i in range(12)) + "\n")
    assert read_sentences(lines)[3] == "sentence 3"
    odd = tmp_path / "s.json"
    odd.write_text(json.dumps(["", " spaces ", "two\nlines", *map(str, range(9))]))
    assert read_sentences(odd)[:3] == ["", " spaces ", "two\nlines"]
    odd.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(QuantizeError, match="JSON array of strings"):
        read_sentences(odd)
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((20, 8)).astype(np.float32)
    same = compare_embeddings(ref, ref * 3)  # cosine ignores the norm
    assert same.mean_cosine == pytest.approx(1.0) and same.retrieval_top10_overlap == 1.0
    shuffled = compare_embeddings(ref, ref[::-1])
    assert shuffled.mean_cosine < 0.9


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 kernel families")
def test_portable_is_judged_on_emulated_avx2_kernels(folder: Path, tmp_path: Path) -> None:
    """The text path through qemu-x86_64 -cpu Haswell: sub-batches of token ids, pooled in the parent."""
    if find_qemu() is None:
        if os.environ.get("CI"):
            pytest.fail("qemu-x86_64 missing: .ci/run installs qemu-user")
        pytest.skip("qemu-x86_64 not installed (apt-get install qemu-user)")
    old = os.environ.get(CPUINFO_ENV)
    os.environ[CPUINFO_ENV] = str(cpuinfo(tmp_path, VNNI_HOST))  # whatever this host is: AVX2 is emulated
    try:
        out = tmp_path / "portable.onnx"
        assert quantize(folder, out, "--target", "portable", "--min-cosine", "0.5") == 0
    finally:
        os.environ.pop(CPUINFO_ENV) if old is None else os.environ.__setitem__(CPUINFO_ENV, old)
    report = json.loads(report_path(out).read_text())
    assert report["recipe"]["reduce_range"] is True
    avx2 = report["targets"]["avx2"]
    assert avx2["judged"] == "qemu" and avx2["command"].endswith("-cpu Haswell")
    assert avx2["similarity"]["n"] == 30 and avx2["similarity"]["mean_cosine"] >= 0.5
    assert report["targets"]["arm64"]["similarity"] is None


def test_the_emulated_outputs_are_replayed_only_to_the_feeds_they_were_made_for() -> None:
    """Under qemu the task runs twice: its feeds recorded natively, then the emulated outputs replayed in order."""
    recorded = [{"input_ids": np.array([[1, 2]])}, {"input_ids": np.array([[3]])}]
    outputs = [np.zeros((1, 2, 4), np.float32), np.ones((1, 1, 4), np.float32)]
    replay = ReplayRunner(recorded, outputs)
    assert replay.infer(recorded[0], ["last_hidden_state"])["last_hidden_state"] is outputs[0]
    with pytest.raises(QuantizeError, match="run 2 asked for other feeds"):
        replay.infer({"input_ids": np.array([[4]])}, ["last_hidden_state"])
    with pytest.raises(QuantizeError, match="1 of 2 runs used"):
        replay.finished()
    assert replay.infer(recorded[1], ["last_hidden_state"])["last_hidden_state"] is outputs[1]
    replay.finished()
    with pytest.raises(QuantizeError, match="run 3 asked for other feeds"):
        replay.infer(recorded[1], ["last_hidden_state"])
