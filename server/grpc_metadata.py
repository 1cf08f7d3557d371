"""A gRPC call's metadata as the REST request's headers, and the REST reply's headers as the call's trailing metadata.

Pure mapping, no grpc import: the tests check it in a process that also imports tritonclient's
generated protos (which would clash with the worker's own `server/grpc_proto` in one descriptor pool).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from onnxpool.server import request_id

TRANSPORT_METADATA = ("content-type", "te", "grpc-", ":")
"""Metadata that is gRPC's own (or HTTP/2's), never a request header of the app's."""

REPLY_METADATA = (request_id.HEADER.lower(), "server-timing", "traceparent", "retry-after", "www-authenticate")
"""Reply headers that go back to the caller as trailing metadata."""


def request_headers(metadata: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The call's metadata that are the app's headers, as WSGI environ keys (`HTTP_...`); not binary (`-bin`) ones."""
    return {
        "HTTP_" + key.upper().replace("-", "_"): value
        for key, value in metadata
        if not key.startswith(TRANSPORT_METADATA) and not key.endswith("-bin")
    }


def reply_metadata(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The trailing metadata of a call's reply (`headers`: lower-case names): what a caller reads, and gRPC's pushback.

    A refusal that says when to come back (`Retry-After`: a shed call, a caller over its quota,
    a model still loading) also says it as `grpc-retry-pushback-ms`, which a client with a retry
    policy (docs/DEPLOYING.md, "A worker that dies") obeys instead of its own backoff: a shed call
    is then retried when REST's caller would retry, not 50 ms later into the same overload.
    """
    trailing = [(name, headers[name]) for name in REPLY_METADATA if name in headers]
    retry_after = headers.get("retry-after", "")
    if retry_after.isdigit():  # seconds (an HTTP date is not what onnxpool sends)
        trailing.append(("grpc-retry-pushback-ms", str(int(retry_after) * 1000)))
    return tuple(trailing)
