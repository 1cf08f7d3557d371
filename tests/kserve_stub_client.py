"""KServe's own gRPC stubs, made from KServe's `open_inference_grpc.proto`, calling a server: what a
KServe v2 gRPC client sends. Run in a process of its own (`python tests/kserve_stub_client.py ADDRESS
MODEL`): its messages share the `inference.` names with tritonclient's, and one process's protobuf
registry holds one definition of each. Prints one JSON document of what each call returned.

The proto is KServe's (tests/fixtures/kserve/, Apache-2.0, licence beside it), compiled here with
grpcio-tools into a temporary folder.
"""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
from pathlib import Path

import grpc
import numpy as np
from grpc_tools import protoc

PROTO = Path(__file__).resolve().parent / "fixtures" / "kserve" / "open_inference_grpc.proto"


def stubs(folder: Path) -> tuple[object, object]:
    args = ["protoc", f"-I{PROTO.parent}", f"--python_out={folder}", f"--grpc_python_out={folder}", str(PROTO)]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed on KServe's proto")
    sys.path.insert(0, str(folder))
    return importlib.import_module("open_inference_grpc_pb2"), importlib.import_module("open_inference_grpc_pb2_grpc")


def main(address: str, model: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        pb, pb_grpc = stubs(Path(folder))
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[attr-defined]
            metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name=model))  # type: ignore[attr-defined]
            spec = metadata.inputs[0]
            shape = [1 if d < 0 else d for d in spec.shape]
            values = np.linspace(0.0, 1.0, int(np.prod(shape)), dtype=np.float32)
            typed = pb.ModelInferRequest(model_name=model, id="typed")  # type: ignore[attr-defined]
            tensor = typed.inputs.add(name=spec.name, datatype="FP32", shape=shape)
            tensor.contents.fp32_contents.extend(values.tolist())
            raw = pb.ModelInferRequest(model_name=model, id="raw", raw_input_contents=[values.tobytes()])  # type: ignore[attr-defined]
            raw.inputs.add(name=spec.name, datatype="FP32", shape=shape)
            answers = {}
            for request in (typed, raw):
                reply = stub.ModelInfer(request)
                output = reply.outputs[0]
                array = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(list(output.shape))
                answers[request.id] = {
                    "id": reply.id,
                    "name": output.name,
                    "shape": list(output.shape),
                    "argmax": int(array.argmax()),
                    "first": float(array.reshape(-1)[0]),
                }
            try:
                stub.ModelReady(pb.ModelReadyRequest(name="no-such-model"))  # type: ignore[attr-defined]
                unknown = "answered"
            except grpc.RpcError as exc:
                unknown = f"{exc.code().name}: {exc.details()}"
            print(
                json.dumps(
                    {
                        "live": stub.ServerLive(pb.ServerLiveRequest()).live,  # type: ignore[attr-defined]
                        "ready": stub.ServerReady(pb.ServerReadyRequest()).ready,  # type: ignore[attr-defined]
                        "model_ready": stub.ModelReady(pb.ModelReadyRequest(name=model)).ready,  # type: ignore[attr-defined]
                        "server": stub.ServerMetadata(pb.ServerMetadataRequest()).name,  # type: ignore[attr-defined]
                        "platform": metadata.platform,
                        "infer": answers,
                        "unknown_model": unknown,
                    }
                )
            )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
