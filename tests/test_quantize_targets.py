"""`onnxpool quantize --target`: the recipe per target, how each target is judged here, the recipe
inside the model, and what the server does with it on a CPU that does not fit (issue 21).

CPU flags are injected with ONNXPOOL_CPUINFO (a /proc/cpuinfo-like file), so the tests mean the
same on a VNNI machine and on an AVX2 one.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path

import onnx
import pytest
import requests

from onnxpool.quantize.errors import QuantizeError
from onnxpool.quantize.report import report_path
from onnxpool.quantize.targets import choose_recipe, find_qemu, plan_judges
from onnxpool.workers.cpu_fit import CPUINFO_ENV, ModelRecipe, check_fit, describe, made_for_this_cpu, parse_cpu_flags
from onnxpool.workers.preflight import probe_model
from tests.harness import running_server, start_and_collect
from tests.test_quantize import SIZE, one_error_line, quantize, work  # noqa: F401 (work: the module fixture)

VNNI_HOST = frozenset({"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"})
AVX2_HOST = frozenset({"sse4_2", "avx", "avx2", "fma"})
x86_only = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 kernel families")


def cpuinfo(tmp_path: Path, flags: frozenset[str]) -> Path:
    path = tmp_path / f"cpuinfo-{len(flags)}"
    path.write_text(f"processor\t: 0\nflags\t\t: {' '.join(sorted(flags))}\n")
    return path


def test_each_target_picks_its_documented_recipe() -> None:
    for flags in (VNNI_HOST, AVX2_HOST):
        assert choose_recipe("portable", flags).reduce_range  # 7-bit weights: exact on AVX2 kernels too
        assert choose_recipe("avx2", flags).reduce_range
        assert choose_recipe("portable", flags).depthwise_8bit  # depthwise kernels sum in int32 everywhere
        assert not choose_recipe("avx512-vnni", flags).reduce_range  # 8-bit: exact on VNNI only
    assert choose_recipe("host", AVX2_HOST, machine="x86_64").depthwise_8bit
    assert not choose_recipe("host", VNNI_HOST, machine="x86_64").depthwise_8bit  # 8-bit everywhere anyway
    assert not choose_recipe("host", VNNI_HOST, machine="x86_64").reduce_range
    assert choose_recipe("host", AVX2_HOST, machine="x86_64").reduce_range
    assert not choose_recipe("host", frozenset(), machine="aarch64").reduce_range
    for target in ("portable", "avx2", "avx512-vnni", "host"):
        recipe = choose_recipe(target, VNNI_HOST, "MinMaxMean")
        assert (recipe.target, recipe.calibrate_method) == (target, "MinMaxMean")
        assert (recipe.activation_type, recipe.weight_type, recipe.per_channel) == ("QUInt8", "QInt8", True)
    with pytest.raises(QuantizeError, match="unknown --target 'avx9'"):
        choose_recipe("avx9", VNNI_HOST)


def test_judges_per_host() -> None:
    on_vnni = {j.kernels.name: j for j in plan_judges("portable", VNNI_HOST, "x86_64", qemu="/usr/bin/qemu-x86_64")}
    assert on_vnni["avx512-vnni"].how == "native"
    assert on_vnni["avx2"].how == "qemu" and on_vnni["avx2"].command == ("/usr/bin/qemu-x86_64", "-cpu", "Haswell")
    assert on_vnni["arm64"].how == "not evaluated" and not on_vnni["arm64"].evaluated
    on_avx2 = {j.kernels.name: j for j in plan_judges("portable", AVX2_HOST, "x86_64", qemu=None)}
    assert on_avx2["avx2"].how == "native"  # no qemu needed: the host IS the family
    assert on_avx2["avx512-vnni"].how == "not evaluated" and "AVX512" in on_avx2["avx512-vnni"].reason
    (vnni_only,) = plan_judges("avx512-vnni", AVX2_HOST, "x86_64", qemu="/usr/bin/qemu-x86_64")
    assert vnni_only.how == "not evaluated"  # qemu's TCG has no AVX512: never "passed"
    with pytest.raises(QuantizeError, match="qemu-x86_64 is not installed"):
        plan_judges("avx2", VNNI_HOST, "x86_64", qemu=None)


def test_cpu_fit_and_metadata_round_trip() -> None:
    made_for_vnni = ModelRecipe("avx512-vnni", False, "QUInt8", "QInt8", "0.2.0")
    assert ModelRecipe.from_metadata(made_for_vnni.to_metadata()) == made_for_vnni
    assert ModelRecipe.from_metadata({"other": "x"}) is None
    assert check_fit(made_for_vnni, VNNI_HOST, "x86_64").ok
    fit = check_fit(made_for_vnni, AVX2_HOST, "x86_64")
    assert fit.label == "no-vnni" and fit.message is not None and "--target portable" in fit.message
    assert check_fit(made_for_vnni, frozenset(), "aarch64").ok  # arm64 sums exactly
    portable = ModelRecipe("portable", True, "QUInt8", "QInt8", "0.2.0")
    assert check_fit(portable, AVX2_HOST, "x86_64").ok
    assert check_fit(None, AVX2_HOST, "x86_64").label == "not-onnxpool"
    shown = describe(made_for_vnni.to_metadata(), AVX2_HOST)
    assert shown is not None and shown["cpu_fit"] == ("ok" if platform.machine() not in ("x86_64",) else "no-vnni")
    assert parse_cpu_flags("processor : 0\nflags : a b\n") == frozenset({"a", "b"})


def test_unknown_target_is_one_line_and_exit_2(
    work: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert quantize(work, "plain.onnx", tmp_path / "o.onnx", "--target", "avx9") == 2
    assert "unknown --target 'avx9'; choose one of: portable, avx2, avx512-vnni, host" in one_error_line(capsys)


@x86_only
def test_missing_qemu_is_one_line_and_exit_2(
    work: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CPUINFO_ENV, str(cpuinfo(tmp_path, VNNI_HOST)))  # a host that needs qemu for avx2
    monkeypatch.setenv("PATH", str(tmp_path))  # ... and has none
    assert quantize(work, "plain.onnx", tmp_path / "o.onnx", "--target", "avx2") == 2
    assert "qemu-x86_64 is not installed (apt-get install qemu-user)" in one_error_line(capsys)
    assert not (tmp_path / "o.onnx").exists()


@x86_only
def test_an_unevaluable_target_is_reported_not_evaluated(
    work: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CPUINFO_ENV, str(cpuinfo(tmp_path, AVX2_HOST)))  # no VNNI kernels "here"
    out = tmp_path / "vnni.onnx"
    code = quantize(
        work, "plain.onnx", out, "--target", "avx512-vnni", "--max-disagreement", "0.2", "--speed-seconds=0"
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert "avx512-vnni: NOT EVALUATED (qemu cannot emulate AVX512" in printed
    report = json.loads(report_path(out).read_text())
    assert report["targets"]["avx512-vnni"]["judged"] == "not evaluated"
    assert report["targets"]["avx512-vnni"]["accuracy"] is None
    assert "NOT evaluated" in report["targets"]["search_proxy"]["reason"]


def test_recipe_travels_in_the_model(work: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "host.onnx"
    assert quantize(work, "plain.onnx", out, "--target", "host", "--max-disagreement", "0.2", "--speed-seconds=0") == 0
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    report = json.loads(report_path(out).read_text())
    assert props["onnxpool.target"] == "host"
    assert props["onnxpool.reduce_range"] == ("true" if report["recipe"]["reduce_range"] else "false")
    assert props["onnxpool.activation_type"] == "QUInt8" and props["onnxpool.weight_type"] == "QInt8"
    copy = tmp_path / "copied.onnx"
    shutil.copyfile(out, copy)  # survives copying: it is in the file
    info = probe_model(copy)  # read back by the master's preflight subprocess (onnxruntime, not onnx)
    assert ModelRecipe.from_metadata(info.metadata_map) == ModelRecipe.from_metadata(props)


@pytest.fixture(scope="module")
def vnni_model(work: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """A tiny INT8 model made for VNNI (the host target on a host that reports VNNI: 8-bit weights)."""
    root = tmp_path_factory.mktemp("vnni-model")
    old = os.environ.get(CPUINFO_ENV)
    os.environ[CPUINFO_ENV] = str(cpuinfo(root, VNNI_HOST))
    try:
        code = quantize(work, "plain.onnx", root / "m.onnx", "--target", "host", "--max-disagreement", "0.2")
    finally:
        os.environ.pop(CPUINFO_ENV) if old is None else os.environ.__setitem__(CPUINFO_ENV, old)
    assert code == 0
    (root / "labels.txt").write_text("".join(f"class {i}\n" for i in range(10)))
    return root


@x86_only
@pytest.mark.slow
def test_server_warns_about_a_vnni_model_on_a_cpu_without_vnni(vnni_model: Path, tmp_path: Path) -> None:
    settings = {
        "ONNXPOOL_MODEL__PATH": str(vnni_model / "m.onnx"),
        "ONNXPOOL_TASK__LABELS": str(vnni_model / "labels.txt"),
        "ONNXPOOL_TASK__PREPROCESS__RESIZE": str(SIZE),
        "ONNXPOOL_TASK__PREPROCESS__CROP": str(SIZE),
        "ONNXPOOL_SERVER__WORKERS": "1",
        CPUINFO_ENV: str(cpuinfo(tmp_path, AVX2_HOST)),
    }
    with running_server(tmp_path, settings, workers=1) as server:
        meta = requests.get(f"{server.url}/v2/models/efficientnet-lite0", timeout=10).json()
        quant = meta["parameters"]["quantization"]
        assert quant["target"] == "host" and quant["reduce_range"] is False and quant["cpu_fit"] == "no-vnni"
        assert "re-make it with `onnxpool quantize --target portable`" in quant["cpu_warning"]
        metrics = requests.get(f"{server.url}/metrics", timeout=10).text
        assert 'onnxpool_model_cpu_fit{cpu_fit="no-vnni",model="efficientnet-lite0",target="host"} 1.0' in metrics
        warnings = [line for line in server.log().splitlines() if "CPU MISMATCH" in line]
        assert len(warnings) == 1 and "has no VNNI" in warnings[0]


@x86_only
@pytest.mark.slow
def test_refusal_setting_stops_the_start(vnni_model: Path, tmp_path: Path) -> None:
    settings = {
        "ONNXPOOL_MODEL__PATH": str(vnni_model / "m.onnx"),
        "ONNXPOOL_TASK__LABELS": str(vnni_model / "labels.txt"),
        "ONNXPOOL_MODEL__CPU_MISMATCH": "refuse",
        CPUINFO_ENV: str(cpuinfo(tmp_path, AVX2_HOST)),
    }
    code, lines = start_and_collect(tmp_path, settings)
    assert code not in (0, None)
    assert len(lines) == 1 and lines[0].startswith("onnxpool: error:") and "has no VNNI" in lines[0], lines
    # the same model on a CPU with VNNI starts (and is "ok")
    settings[CPUINFO_ENV] = str(cpuinfo(tmp_path, VNNI_HOST))
    settings["ONNXPOOL_SERVER__WORKERS"] = "1"
    with running_server(tmp_path, settings, workers=1) as server:
        meta = requests.get(f"{server.url}/v2/models/efficientnet-lite0", timeout=10).json()
        assert meta["parameters"]["quantization"]["cpu_fit"] == "ok"


@x86_only
def test_portable_is_judged_on_emulated_avx2_kernels(work: Path, tmp_path: Path) -> None:  # noqa: F811
    """The one real qemu check: a tiny model, the AVX2 family under qemu-x86_64 -cpu Haswell."""
    if find_qemu() is None:
        if os.environ.get("CI"):
            pytest.fail("qemu-x86_64 missing: .ci/run installs qemu-user")
        pytest.skip("qemu-x86_64 not installed (apt-get install qemu-user)")
    cpu = cpuinfo(tmp_path, VNNI_HOST)
    old = os.environ.get(CPUINFO_ENV)
    os.environ[CPUINFO_ENV] = str(cpu)  # whatever this host is: AVX2 is judged under emulation
    try:
        out = tmp_path / "portable.onnx"
        code = quantize(
            work, "plain.onnx", out, "--target", "portable", "--eval", str(work / "eval"),
            "--max-disagreement", "0.2", "--speed-seconds=0",
        )  # fmt: skip
    finally:
        os.environ.pop(CPUINFO_ENV) if old is None else os.environ.__setitem__(CPUINFO_ENV, old)
    assert code == 0
    report = json.loads(report_path(out).read_text())
    assert report["target"] == "portable" and report["recipe"]["reduce_range"] is True
    avx2 = report["targets"]["avx2"]
    assert avx2["judged"] == "qemu" and avx2["command"].endswith("-cpu Haswell")
    assert avx2["accuracy"]["n"] == 32 and avx2["accuracy"]["top1_agreement"] >= 0.8
    assert report["targets"]["arm64"]["judged"] == "not evaluated"


def weight_bits(model_path: Path) -> dict[str, int]:
    """Per Conv of a QDQ model: the largest |int8 weight| (63/64 with 7-bit weights, up to 127 with 8)."""
    model = onnx.load(str(model_path))
    constants = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for node in (n for n in model.graph.node if n.op_type == "Conv"):
        dq = producer.get(node.input[1])
        if dq is not None and dq.op_type == "DequantizeLinear":
            out[node.name] = int(abs(constants[dq.input[0]].astype(int)).max())
    return out


def test_depthwise_convolutions_keep_8bit_weights_with_reduce_range(tmp_path: Path) -> None:
    """portable/avx2/host-without-VNNI: 7-bit weights, but 8-bit (and its bias) in depthwise convolutions."""
    from tests.test_quantize import _images
    from tests.tiny_models import small_cnn

    small_cnn(tmp_path / "dw.onnx", SIZE, fragile=False, depthwise=True)
    _images(tmp_path / "calib", 24, seed=1)
    (tmp_path / "settings.toml").write_text(f"[task.preprocess]\nresize = {SIZE}\ncrop = {SIZE}\n")
    old = os.environ.get(CPUINFO_ENV)
    os.environ[CPUINFO_ENV] = str(cpuinfo(tmp_path, AVX2_HOST))  # host = AVX2 without VNNI: 7-bit weights
    try:
        made = {}
        for flag in ("--depthwise-8bit", "--no-depthwise-8bit"):
            made[flag] = out = tmp_path / f"{flag}.onnx"
            code = quantize(
                tmp_path, "dw.onnx", out, flag, "--max-disagreement", "1", "--speed-seconds=0", "--target", "host"
            )
            assert code == 0
    finally:
        os.environ.pop(CPUINFO_ENV) if old is None else os.environ.__setitem__(CPUINFO_ENV, old)
    on, off = weight_bits(made["--depthwise-8bit"]), weight_bits(made["--no-depthwise-8bit"])
    assert on["conv_c"] > 64 >= max(on["conv_a"], on["conv_b"])  # the depthwise conv alone has 8-bit weights
    assert max(off.values()) <= 64
    report = json.loads(report_path(made["--depthwise-8bit"]).read_text())
    assert report["recipe"]["depthwise_8bit"] is True and report["recipe"]["reduce_range"] is True


def test_which_build_is_made_for_which_cpu() -> None:
    vnni, avx2, portable = (
        ModelRecipe(t, t != "avx512-vnni", "QUInt8", "QInt8", "0") for t in ("avx512-vnni", "avx2", "portable")
    )
    assert made_for_this_cpu(vnni, VNNI_HOST, "x86_64") == "made for avx512-vnni and this CPU has avx512_vnni"
    assert made_for_this_cpu(vnni, AVX2_HOST, "x86_64") is None
    assert made_for_this_cpu(avx2, AVX2_HOST, "x86_64") is not None and made_for_this_cpu(avx2, VNNI_HOST) is None
    assert made_for_this_cpu(portable, VNNI_HOST, "x86_64") is None  # the fallback is `path`'s job
    assert made_for_this_cpu(vnni, VNNI_HOST, "aarch64") is None and made_for_this_cpu(None, VNNI_HOST) is None


@x86_only
@pytest.mark.slow
def test_the_build_made_for_this_cpu_is_served(vnni_model: Path, work: Path, tmp_path: Path) -> None:  # noqa: F811
    """`[model] cpu_variants`: a VNNI build on a VNNI CPU, `path` (here FP32) elsewhere, with the reason logged."""
    made = onnx.load(str(vnni_model / "m.onnx"))
    for prop in made.metadata_props:
        if prop.key == "onnxpool.target":
            prop.value = "avx512-vnni"  # the host build of a VNNI host is a VNNI build
    onnx.save(made, str(tmp_path / "vnni-build.onnx"))
    settings = {
        "ONNXPOOL_MODEL__PATH": str(work / "plain.onnx"),
        "ONNXPOOL_MODEL__CPU_VARIANTS": json.dumps([str(tmp_path / "missing.onnx"), str(tmp_path / "vnni-build.onnx")]),
        "ONNXPOOL_TASK__LABELS": str(vnni_model / "labels.txt"),
        "ONNXPOOL_TASK__PREPROCESS__RESIZE": str(SIZE),
        "ONNXPOOL_TASK__PREPROCESS__CROP": str(SIZE),
        "ONNXPOOL_SERVER__WORKERS": "1",
    }
    for flags, target in ((VNNI_HOST, "avx512-vnni"), (AVX2_HOST, None)):
        settings[CPUINFO_ENV] = str(cpuinfo(tmp_path, flags))
        with running_server(tmp_path, settings, workers=1) as server:
            meta = requests.get(f"{server.url}/v2/models/efficientnet-lite0", timeout=10).json()
            log = server.log()
        assert meta.get("parameters", {}).get("quantization", {}).get("target") == target
        assert "missing.onnx passed over: model file" in log  # one line, and the start goes on
        chosen = [line for line in log.splitlines() if "model file:" in line]
        if target:
            assert "vnni-build.onnx (made for avx512-vnni and this CPU has avx512_vnni), not" in chosen[0]
        else:
            assert "plain.onnx (none of [model] cpu_variants is made for this CPU" in chosen[0]
