"""The generated code in server/grpc_proto and setup.cfg's protobuf and grpcio ranges agree.

protoc's Python output refuses a protobuf runtime older than its gencode, and the gRPC plugin's a
grpcio older than itself (tools/generate_grpc.py): each range's lower bound is exactly what the
generator wrote. Protobuf's cross-version guarantee lets a runtime load the gencode of its own
major and of the one before, so the upper bound may reach one major past the gencode, no further.
"""

from __future__ import annotations

import configparser
import re

from packaging.requirements import Requirement
from packaging.version import Version

from tests.harness import REPO

PROTO_DIR = REPO / "server" / "grpc_proto"


def install_requires() -> dict[str, Requirement]:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg", encoding="utf-8")
    lines = [line.split("#")[0].strip() for line in config["options"]["install_requires"].splitlines()]
    requirements = [Requirement(line) for line in lines if line]
    return {req.name: req for req in requirements}


def lower_bound(req: Requirement) -> Version:
    (floor,) = [Version(spec.version) for spec in req.specifier if spec.operator == ">="]
    return floor


def generated(pattern: str, glob: str) -> set[str]:
    found = {m for path in PROTO_DIR.glob(glob) for m in re.findall(pattern, path.read_text(), flags=re.M)}
    assert found, f"no {pattern!r} in {glob}"
    return found


def test_protobuf_range_starts_at_the_gencode_and_ends_within_its_window() -> None:
    (gencode,) = generated(r"^# Protobuf Python Version: (\S+)$", "*_pb2.py")
    protobuf = install_requires()["protobuf"]
    assert lower_bound(protobuf) == Version(gencode)
    assert protobuf.specifier.contains(gencode)
    assert not protobuf.specifier.contains(f"{Version(gencode).major + 2}.0.0")


def test_grpcio_range_starts_at_the_generator() -> None:
    (made_by,) = generated(r"^GRPC_GENERATED_VERSION = '(\S+)'$", "*_pb2_grpc.py")
    assert lower_bound(install_requires()["grpcio"]) == Version(made_by)


def test_health_stubs_are_onnxpools_own() -> None:
    # grpcio-health-checking pins protobuf to one major per release; its stubs are generated here instead.
    assert "grpcio-health-checking" not in install_requires()
    assert (PROTO_DIR / "health.proto").is_file() and (PROTO_DIR / "health_pb2_grpc.py").is_file()
