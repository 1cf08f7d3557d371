"""Which operator makes each of a model's outputs, read from the ONNX file (preflight subprocess).

onnxruntime's session tells the outputs' names and types but not how they are made, and a
classifier's scores must be treated differently when the graph ends in a Softmax (already
probabilities: a second softmax would flatten them to ~1/classes) or a Sigmoid (multi-label).
The `onnx` package is not a runtime dependency, so the file is read with protobuf (which the
gRPC server needs anyway) through a descriptor of the few ONNX fields needed here: a node's
inputs, outputs and op_type, the graph's nodes and outputs. Everything else in the file
(weights, attributes) is an unknown field to this descriptor and is skipped by the parser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]

SHAPE_ONLY = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast", "Dropout"})
"""Ops that move values without changing them: a Softmax followed by a Flatten still makes probabilities."""

_FIELDS = {
    # ONNX's onnx.proto field numbers (stable since IR version 1).
    "NodeProto": [("input", 1, "string", True), ("output", 2, "string", True), ("op_type", 4, "string", False)],
    "ValueInfoProto": [("name", 1, "string", False)],
    "GraphProto": [("node", 1, "NodeProto", True), ("output", 12, "ValueInfoProto", True)],
    "ModelProto": [("graph", 7, "GraphProto", False)],
}
_PACKAGE = "onnxpool_onnx_outputs"


def _model_class() -> Any:
    file = descriptor_pb2.FileDescriptorProto(name=f"{_PACKAGE}.proto", package=_PACKAGE, syntax="proto2")
    for message, fields in _FIELDS.items():
        proto = file.message_type.add(name=message)
        for name, number, kind, repeated in fields:
            field = proto.field.add(name=name, number=number)
            field.label = field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL
            if kind == "string":
                field.type = field.TYPE_STRING
            else:
                field.type, field.type_name = field.TYPE_MESSAGE, f".{_PACKAGE}.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.ModelProto"))


def output_producers(path: Path) -> dict[str, str]:
    """Each graph output's producing op type, looking through `SHAPE_ONLY` ops ("" for a graph input or
    an initializer). An unreadable file gives {}: the session already said whether it loads."""
    try:
        model = _model_class().FromString(path.read_bytes())
    except Exception:  # a file onnxruntime loads but this subset cannot read: no facts, not an error
        return {}
    made_by = {output: node for node in model.graph.node for output in node.output}
    producers = {}
    for output in model.graph.output:
        name, seen = output.name, set()
        node = made_by.get(name)
        while node is not None and node.op_type in SHAPE_ONLY and node.input and name not in seen:
            seen.add(name)
            name = node.input[0]
            node = made_by.get(name)
        producers[output.name] = node.op_type if node is not None else ""
    return producers
