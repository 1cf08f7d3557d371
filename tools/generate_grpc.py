"""Regenerate the gRPC code of the Open Inference Protocol from the vendored protos.

    .venv/bin/python tools/generate_grpc.py

The protos (server/grpc_proto/*.proto) are Triton's `grpc_service.proto` and `model_config.proto`
as published (triton-inference-server/common, BSD-3-Clause, licence beside them): the Open
Inference Protocol's `inference.GRPCInferenceService` plus the calls tritonclient.grpc makes
beyond it (ModelConfig, RepositoryIndex). KServe's `open_inference_grpc.proto` is the same
service and messages, a subset, so its stubs call this service unchanged.

protoc (grpcio-tools) writes top-level imports (`import model_config_pb2`); inside the package
they must be relative, which is the one edit made to its output.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_DIR = Path(__file__).resolve().parents[1] / "server" / "grpc_proto"
PROTOS = ("model_config.proto", "grpc_service.proto")


def main() -> int:
    for proto in PROTOS:
        args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={PROTO_DIR}", f"--pyi_out={PROTO_DIR}"]
        if proto == "grpc_service.proto":
            args.append(f"--grpc_python_out={PROTO_DIR}")
        if protoc.main([*args, str(PROTO_DIR / proto)]) != 0:
            print(f"protoc failed on {proto}", file=sys.stderr)
            return 1
    for generated in PROTO_DIR.glob("*_pb2*.py*"):
        text = generated.read_text()
        fixed = re.sub(r"^import (\w+_pb2) as (\w+)$", r"from . import \1 as \2", text, flags=re.M)
        fixed = re.sub(r"^import (\w+_pb2)$", r"from . import \1", fixed, flags=re.M)
        generated.write_text(fixed)
    print(f"generated into {PROTO_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
