"""An inference log's events: one request and its reply, as KServe's CloudEvents or as one JSON line.

Built in the worker after the reply has left (`server.inference_log`), never on the request's
path. The CloudEvents are KServe's logger's, attribute for attribute (kserve/kserve,
pkg/logger/worker.go), in the binary content mode of the CloudEvents HTTP binding: the
attributes are `ce-*` headers, the body is the request's or the reply's body as it was on the
wire, with its own Content-Type. The request and the reply share one `ce-id`. onnxpool adds two
extensions a KServe consumer ignores: `statuscode` on a reply (failed replies are logged too,
KServe logs only 200s) and `inferenceheadercontentlength` on a v2 binary-tensor body (where its
JSON header ends, so a consumer can read the tensors that follow).

A file record holds both sides of a request in one JSON object, readable without the wire
format: the request's inputs as the task reads them (`Task.logged`: features, strings, image
digests) or as named v2 tensors with shape, datatype and data, and the reply's JSON document.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import numpy as np

from onnxpool.server.datatypes import V2_TO_NUMPY
from onnxpool.server.inference_log_plan import InferenceLogPlan
from onnxpool.tasks import jsonfast
from onnxpool.tasks.api import JsonDocument
from onnxpool.tasks.logged import digest

SPEC_VERSION = "1.0"
REQUEST_TYPE = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE = "org.kubeflow.serving.inference.response"
JSON_TYPES = ("application/json", "application/cloudevents+json")


@dataclass(slots=True)
class Exchange:
    """One request and its reply, as the data plane saw them: references only, nothing copied or encoded."""

    ce_id: str
    endpoint: str
    """The path asked (`/v2/models/m/infer`)."""
    request_time: float
    request_type: str
    request_body: bytes
    request_header_length: int | None
    metadata: dict[str, list[str]]
    status: int = 0
    response_time: float = 0.0
    response_type: str = ""
    response_body: bytes = b""
    response_header_length: int | None = None
    inputs: Callable[[], JsonDocument] | None = None
    """The task's (or v2's) readable view of the inputs, made only for a file record."""
    sides: tuple[bool, bool] = field(default=(True, True))
    """(request, response): which sides this exchange logs."""
    v2: bool = False
    """A v2 infer request: its inputs view holds its tensors (the body is not repeated in a record)."""


@dataclass(frozen=True, slots=True)
class Event:
    """One CloudEvent in binary mode: its headers and body."""

    headers: dict[str, str]
    body: bytes

    @property
    def size(self) -> int:
        return len(self.body) + sum(len(k) + len(v) + 4 for k, v in self.headers.items())


_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"%')
"""What a `ce-*` header value carries as is: printable ASCII but the double quote and the percent sign (the
CloudEvents HTTP binding, 3.1.3.2: space, `"`, `%` and anything else are percent-encoded)."""


def header_value(value: str) -> str:
    return quote(value, safe=_SAFE)


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def cloudevents(plan: InferenceLogPlan, exchange: Exchange, now: float) -> list[Event]:
    """The exchange's request and/or response event (by `plan.mode` and `exchange.sides`)."""
    common = {
        "ce-specversion": SPEC_VERSION,
        "ce-id": header_value(exchange.ce_id),
        "ce-source": header_value(plan.source),
        "ce-inferenceservicename": header_value(plan.service),
        "ce-namespace": header_value(plan.namespace),
        "ce-component": header_value(plan.component),
        "ce-endpoint": header_value(plan.endpoint),
        "ce-metadata": header_value(jsonfast.dumps(exchange.metadata).decode()),
        "ce-recordedtime": rfc3339(now),
    }
    events: list[Event] = []
    if exchange.sides[0]:
        headers = {**common, "ce-type": REQUEST_TYPE, "ce-time": rfc3339(exchange.request_time)}
        _content(headers, exchange.request_type, exchange.request_header_length)
        events.append(Event(headers, exchange.request_body))
    if exchange.sides[1]:
        headers = {**common, "ce-type": RESPONSE_TYPE, "ce-time": rfc3339(exchange.response_time)}
        headers["ce-statuscode"] = str(exchange.status)
        _content(headers, exchange.response_type, exchange.response_header_length)
        events.append(Event(headers, exchange.response_body))
    return events


def _content(headers: dict[str, str], content_type: str, header_length: int | None) -> None:
    if content_type:
        headers["Content-Type"] = content_type
    if header_length is not None:
        headers["ce-inferenceheadercontentlength"] = str(header_length)


def record(plan: InferenceLogPlan, exchange: Exchange) -> bytes:
    """The exchange as one JSON line (files): both sides, readable (see the module doc)."""
    return jsonfast.dumps(record_document(plan, exchange)) + b"\n"


def record_document(plan: InferenceLogPlan, exchange: Exchange) -> dict[str, Any]:
    """The exchange as one record: both sides, readable (numpy arrays left for orjson to write)."""
    document: dict[str, Any] = {
        "id": exchange.ce_id,
        "model": plan.model,
        "service": plan.service,
        "namespace": plan.namespace,
        "source": plan.source,
        "endpoint": exchange.endpoint,
        "status": exchange.status,
    }
    if exchange.sides[0]:
        request: dict[str, Any] = {
            "time": rfc3339(exchange.request_time),
            "content_type": exchange.request_type,
            "bytes": len(exchange.request_body),
            "metadata": exchange.metadata,
        }
        view = exchange.inputs() if exchange.inputs is not None else None
        # The body as sent, for a replay, where it is JSON and the inputs are not it already (v2's tensors).
        body = None if exchange.v2 else _json_body(exchange.request_type, exchange.request_body, None)
        if body is not None:
            request["body"] = body
        request["inputs"] = view if view is not None else _opaque(body, exchange.request_body)
        document["request"] = request
    if exchange.sides[1]:
        response: dict[str, Any] = {
            "time": rfc3339(exchange.response_time),
            "status": exchange.status,
            "content_type": exchange.response_type,
        }
        if exchange.response_header_length is not None:
            response["body"] = v2_view(exchange.response_body, exchange.response_header_length, plan.tensor_elements)
        else:
            response["body"] = _json_body(exchange.response_type, exchange.response_body, None)
        document["response"] = response
    return document


def _json_body(content_type: str, body: bytes, header_length: int | None) -> JsonDocument | None:
    """A JSON body as its document (None: not JSON, or a v2 binary body: its view says it)."""
    if header_length is not None or not body:
        return None
    mimetype = content_type.split(";", 1)[0].strip().lower()
    if mimetype and mimetype not in JSON_TYPES and not mimetype.endswith("+json"):
        return None
    try:
        return jsonfast.loads(body)
    except Exception:  # a refused request's body may be anything
        return None


def _opaque(document: JsonDocument | None, body: bytes) -> JsonDocument:
    """Inputs no task described: the JSON body, else the body's digest and size (never its bytes)."""
    return document if document is not None else digest(body)


def v2_view(body: bytes, header_length: int | None, max_elements: int | None = None) -> JsonDocument:
    """A v2 infer body (request or reply; JSON or binary tensors) as JSON with every tensor's data inline.

    A tensor of more than `max_elements` elements (an image's pixels: 150528 floats, 1.5 MB of JSON) keeps
    its name, datatype and shape, and its data becomes `data_sha256` and `data_bytes` (of its wire bytes).
    """
    end = len(body) if header_length is None else header_length
    try:
        document = jsonfast.loads(memoryview(body)[:end])
    except Exception:
        return digest(body)
    if not isinstance(document, dict):
        return document
    offset = end
    for key in ("inputs", "outputs"):
        for item in document.get(key) or ():
            if not isinstance(item, dict):
                continue
            parameters = item.get("parameters") or {}
            size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
            large = max_elements is not None and _elements(item.get("shape")) > max_elements
            if not isinstance(size, int) or header_length is None:
                if large and "data" in item:
                    _summarise(item, jsonfast.dumps(item.pop("data")))
                continue
            raw = memoryview(body)[offset : offset + size]
            offset += size
            parameters.pop("binary_data_size", None)
            if large:
                _summarise(item, raw)
            else:
                item["data"] = _decode(str(item.get("datatype", "")), raw)
    return document


def _elements(shape: Any) -> int:
    if not isinstance(shape, list) or not all(isinstance(n, int) for n in shape):
        return 0
    return int(np.prod(shape)) if shape else 1


def _summarise(item: dict[str, Any], raw: bytes | memoryview) -> None:
    found = digest(raw)
    item["data_sha256"], item["data_bytes"] = found["sha256"], found["bytes"]


def _decode(datatype: str, raw: memoryview) -> Any:
    """Binary tensor bytes as a flat list (BYTES: 4-byte little-endian lengths, then the bytes)."""
    if datatype == "BYTES":
        items, i, data = [], 0, bytes(raw)
        while i + 4 <= len(data):
            n = int.from_bytes(data[i : i + 4], "little")
            items.append(data[i + 4 : i + 4 + n].decode("utf-8", "replace"))
            i += 4 + n
        return items
    dtype = V2_TO_NUMPY.get(datatype)
    if dtype is None or len(raw) % dtype.itemsize:
        return digest(raw)
    array = np.frombuffer(raw, dtype)  # written by orjson: a float32 as its shortest repr
    return array.astype(np.float32) if dtype == np.float16 else array
