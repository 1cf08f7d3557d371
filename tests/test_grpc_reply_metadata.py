"""A gRPC call's metadata and its REST request's headers, both ways (pure logic; the calls themselves: test_grpc.py)."""

from __future__ import annotations

from onnxpool.server.grpc_metadata import reply_metadata, request_headers


def test_a_refusal_with_retry_after_says_it_as_grpc_pushback_too() -> None:
    shed = {"retry-after": "1", "x-request-id": "abc", "content-type": "application/json"}
    # A client with a retry policy waits the pushback, not its own 50 ms backoff (checked against grpcio by hand).
    assert dict(reply_metadata(shed)) == {"x-request-id": "abc", "retry-after": "1", "grpc-retry-pushback-ms": "1000"}


def test_an_answer_carries_only_what_the_caller_reads() -> None:
    assert reply_metadata({"server-timing": "total;dur=5.0", "content-length": "12"}) == (
        ("server-timing", "total;dur=5.0"),
    )


def test_a_retry_after_that_is_not_seconds_gives_no_pushback() -> None:
    assert "grpc-retry-pushback-ms" not in dict(reply_metadata({"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}))


def test_the_callers_metadata_are_headers_but_not_grpcs_own() -> None:
    metadata = [
        ("authorization", "Bearer k"),
        ("x-request-id", "r1"),
        ("grpc-accept-encoding", "gzip"),
        ("user-agent", "grpc-python/1.85"),
        ("te", "trailers"),
        ("trace-bin", "\x00"),
    ]
    assert request_headers(metadata) == {
        "HTTP_AUTHORIZATION": "Bearer k",
        "HTTP_X_REQUEST_ID": "r1",
        "HTTP_USER_AGENT": "grpc-python/1.85",
    }
