"""The gRPC router's one read of a message: the model named in field 1 (host/grpc_wire.py)."""

from __future__ import annotations

import pytest
from tritonclient.grpc import service_pb2 as pb

from onnxpool.host.grpc_wire import WireError, first_string


def test_the_model_name_is_read_from_field_1_without_the_tensors() -> None:
    request = pb.ModelInferRequest(model_name="iris", model_version="1", id="x")
    request.raw_input_contents.append(b"\0" * 1_000_000)
    assert first_string(request.SerializeToString()) == "iris"
    for message in (pb.ModelMetadataRequest, pb.ModelReadyRequest, pb.ModelConfigRequest, pb.ModelStatisticsRequest):
        assert first_string(message(name="résumé", version="2").SerializeToString()) == "résumé"
    assert first_string(pb.ModelInferRequest(id="no name").SerializeToString()) == ""  # proto3: absent is ""


def test_fields_before_field_1_are_skipped_by_their_wire_type() -> None:
    tail = pb.ModelInferRequest(model_name="tiny").SerializeToString()
    # field 3 (string), field 7 as a varint, fixed64 and fixed32 fields, then field 1: any order is valid protobuf.
    others = b"\x1a\x03abc" + b"\x38\x96\x01" + b"\x41" + b"\0" * 8 + b"\x4d" + b"\0" * 4
    assert first_string(others + tail) == "tiny"
    with pytest.raises(WireError):
        first_string(b"\x0a\x10short")
    with pytest.raises(WireError):
        first_string(b"\x0b")  # a group: not in these messages
