"""Regenerate the gRPC code of the Open Inference Protocol and grpc.health.v1 from the vendored protos.

    .venv/bin/python tools/generate_grpc.py

The protos (server/grpc_proto/*.proto) are Triton's `grpc_service.proto` and `model_config.proto`
as published (triton-inference-server/common, BSD-3-Clause, licence beside them): the Open
Inference Protocol's `inference.GRPCInferenceService` plus the calls tritonclient.grpc makes
beyond it (ModelConfig, RepositoryIndex). KServe's `open_inference_grpc.proto` is the same
service and messages, a subset, so its stubs call this service unchanged. `health.proto` is
gRPC's own `grpc.health.v1` (Apache-2.0, header in the file), generated here rather than taken
from grpcio-health-checking, whose every release pins protobuf to one major version.

Why the pinned, old generator: protoc's Python output checks the protobuf runtime at import
(`ValidateProtobufRuntimeVersion`: the runtime may not be older than the gencode), and the gRPC
plugin's output refuses a grpcio older than itself. So the oldest generator makes the widest
range: grpcio-tools 1.72.1 (1.72.0 was yanked) bundles protoc 30.0, whose Python gencode is
6.30.0, the first of protobuf's 6.x. Protobuf's cross-version runtime guarantee (since 30.x) has
a runtime run the gencode of its own major and of the one before, so gencode 6.30.0 loads on
every 6.x from 6.30.0 and every 7.x: setup.cfg's `protobuf>=6.30.0,<8` and `grpcio>=1.72.1`
are these two versions (tests/test_grpc_gencode.py checks they agree). An older generator
(protobuf 5.x gencode) would fall outside the window of protobuf 7.

The script runs the pinned generator in a venv of its own (build/grpc-tools/, made on first use):
grpcio-tools 1.72.1 needs protobuf <7, which the dev environment need not have.

protoc (grpcio-tools) writes top-level imports (`import model_config_pb2`); inside the package
they must be relative, which is the one edit made to its output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTO_DIR = REPO / "server" / "grpc_proto"
PROTOS = ("model_config.proto", "grpc_service.proto", "health.proto")
SERVICES = ("grpc_service.proto", "health.proto")
GENERATOR = ("grpcio-tools==1.72.1", "grpcio==1.72.1", "protobuf==6.30.0")
GENERATOR_VENV = REPO / "build" / "grpc-tools"


def _pinned_generator_here() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return all(version(pin.split("==")[0]) == pin.split("==")[1] for pin in GENERATOR)
    except PackageNotFoundError:
        return False


def _run_in_generator_venv() -> int:
    python = GENERATOR_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(GENERATOR_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *GENERATOR], check=True)
    env = {**os.environ, "ONNXPOOL_GRPC_GENERATOR": "1"}
    return subprocess.run([str(python), __file__], env=env, check=False).returncode


def generate() -> int:
    from grpc_tools import protoc

    for proto in PROTOS:
        args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={PROTO_DIR}", f"--pyi_out={PROTO_DIR}"]
        if proto in SERVICES:
            args.append(f"--grpc_python_out={PROTO_DIR}")
        if protoc.main([*args, str(PROTO_DIR / proto)]) != 0:
            print(f"protoc failed on {proto}", file=sys.stderr)
            return 1
    for generated in PROTO_DIR.glob("*_pb2*.py*"):
        text = generated.read_text()
        fixed = re.sub(r"^import (\w+_pb2) as (\w+)$", r"from . import \1 as \2", text, flags=re.M)
        fixed = re.sub(r"^import (\w+_pb2)$", r"from . import \1", fixed, flags=re.M)
        generated.write_text(fixed)
    print(f"generated into {PROTO_DIR} with {', '.join(GENERATOR)}")
    return 0


def main() -> int:
    if _pinned_generator_here():
        return generate()
    if os.environ.get("ONNXPOOL_GRPC_GENERATOR"):
        print(f"the generator venv {GENERATOR_VENV} does not hold {GENERATOR}", file=sys.stderr)
        return 1
    return _run_in_generator_venv()


if __name__ == "__main__":
    sys.exit(main())
