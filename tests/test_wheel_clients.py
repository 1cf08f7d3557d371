"""onnxpool shares one environment with Triton's and KServe's clients: the wheel, the newest
`tritonclient[grpc]` and `kserve==0.21.0`, installed together into a fresh venv by pip (as a team
adding onnxpool to an image that holds both would), resolve without a conflict and without pip
falling back to an older tritonclient; the server from that venv answers that venv's
tritonclient.grpc with what onnxruntime computes in process, and REST too.

It needs PyPI (pip's cache makes a rerun cheap); CI has it, and so runs it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import REPO, Server, free_port, spawn_logged

pytestmark = pytest.mark.slow

KSERVE = "kserve==0.21.0"

CLIENT = textwrap.dedent("""\
    # Run by the venv's python: its tritonclient, its onnxruntime, its onnxpool's model file.
    import json, sys
    import numpy as np, onnxruntime, requests
    import tritonclient.grpc as grpcclient
    from importlib.metadata import version
    from importlib.resources import files

    grpc_address, rest_url, name = sys.argv[1:4]
    model = files("onnxpool.models") / name / "model.onnx"
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    image = np.random.default_rng(7).random([1, 3, 224, 224], dtype=np.float32)
    expected = session.run(["logits"], {"input": image})[0]
    with grpcclient.InferenceServerClient(grpc_address) as client:
        assert client.is_server_ready() and client.is_model_ready(name)
        tensor = grpcclient.InferInput("input", list(image.shape), "FP32")
        tensor.set_data_from_numpy(image)
        grpc_logits = client.infer(name, [tensor]).as_numpy("logits")
    body = {"inputs": [{"name": "input", "shape": list(image.shape), "datatype": "FP32",
                        "data": image.ravel().tolist()}]}
    reply = requests.post(f"{rest_url}/v2/models/{name}/infer", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    (output,) = reply.json()["outputs"]
    rest_logits = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    print(json.dumps({
        "grpc": float(np.abs(grpc_logits - expected).max()),
        "rest": float(np.abs(rest_logits - expected).max()),
        "tritonclient": version("tritonclient"),
    }))
    """)


def run(argv: list[str], cwd: Path, timeout: float = 900) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def newest(package: str, cwd: Path) -> str:
    """The newest release pip can see (the index pip installs from)."""
    listing = run([sys.executable, "-m", "pip", "index", "versions", package], cwd)
    found = re.search(rf"^{re.escape(package)} \(([^)]+)\)", listing, flags=re.M)
    assert found, listing
    return found.group(1)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv, outside the checkout, with the wheel, tritonclient[grpc] and kserve; yields its bin/."""
    tmp = tmp_path_factory.mktemp("clients")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp / "dist"), str(REPO)], tmp)
    (wheel,) = (tmp / "dist").glob("onnxpool-*.whl")
    run([sys.executable, "-m", "venv", str(tmp / "venv")], tmp)
    pip = [str(tmp / "venv" / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", "--quiet", str(wheel), "tritonclient[grpc]", KSERVE], tmp)
    yield tmp / "venv" / "bin"


def test_pip_resolves_the_newest_tritonclient_and_no_conflict(venv: Path, tmp_path: Path) -> None:
    check = subprocess.run([str(venv / "python"), "-m", "pip", "check"], capture_output=True, text=True, check=False)
    assert check.returncode == 0 and "No broken requirements found." in check.stdout, check.stdout + check.stderr
    script = "import importlib.metadata as md; print(md.version('tritonclient'), md.version('kserve'))"
    triton, kserve = run([str(venv / "python"), "-c", script], tmp_path).split()
    assert (triton, kserve) == (newest("tritonclient", tmp_path), KSERVE.split("==")[1])


def test_the_venvs_server_answers_its_tritonclient_grpc_and_rest(venv: Path, tmp_path: Path) -> None:
    port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONNXPOOL_", "VIRTUAL_ENV"))}
    env |= {"PATH": f"{venv}:{env.get('PATH', '')}", "ONNXPOOL_CACHE__ENABLED": "false"}
    env["ONNXPOOL_SERVER__GRPC_BIND"] = f"127.0.0.1:{grpc_port}"
    argv = [str(venv / "onnxpool"), "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    log = tmp_path / "serve.log"
    server = Server(process=spawn_logged(argv, log, env), port=port, log_path=log)
    try:
        server.wait_ready(1, timeout=120)
        (tmp_path / "client.py").write_text(CLIENT, encoding="utf-8")
        argv = [str(venv / "python"), str(tmp_path / "client.py"), f"127.0.0.1:{grpc_port}", server.url]
        found = json.loads(run([*argv, "efficientnet-lite0"], tmp_path, timeout=120).splitlines()[-1])
        assert found["grpc"] < 1e-4 and found["rest"] < 1e-4, found
        assert "gRPC: worker pid=" in server.log() and str(REPO) not in server.log()
    finally:
        server.stop()
