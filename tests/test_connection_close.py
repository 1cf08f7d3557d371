"""How a sync worker ends a connection: at once when the request was read, gracefully when not.

A real one-worker server. A client that read its reply but keeps its socket open
must not hold the worker (gunicorn's graceful close would wait up to 2 s for its
FIN); a reply sent before the request body was read must still reach the client
whole (the graceful close is kept there, so no reset truncates it).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from onnxpool.measure.paths import CAT_JPEG
from tests.harness import Server, running_server

# gunicorn's close_graceful waits this long for the client's FIN
GRACEFUL_WAIT = 2.0


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("close"), {"ONNXPOOL_SERVER__WORKERS": "1"}, workers=1) as srv:
        yield srv


def _raw_request(server: Server, body: bytes, headers: str = "") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    head = (
        f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
        f"Cache-Control: no-store\r\n{headers or f'Content-Length: {len(body)}'}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def _read_reply(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes its side."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_client_that_keeps_its_socket_open_does_not_hold_the_worker(one_worker: Server) -> None:
    image = CAT_JPEG.read_bytes()
    lingering = _raw_request(one_worker, image)
    try:
        assert _read_reply(lingering).startswith(b"HTTP/1.1 200")  # ...and the socket stays open
        start = time.monotonic()
        follower = _raw_request(one_worker, image)
        with follower:
            assert _read_reply(follower).startswith(b"HTTP/1.1 200")
        assert time.monotonic() - start < GRACEFUL_WAIT / 2
    finally:
        lingering.close()


def test_a_reply_before_the_body_is_read_still_arrives_whole(one_worker: Server) -> None:
    # Content-Length over [server] max_body_bytes: 413 straight away, the body never read.
    sock = _raw_request(one_worker, b"\xff\xd8" + b"\0" * 4096, headers="Content-Length: 999999999")
    with sock:
        reply = _read_reply(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    assert len(body) == length and b"the limit is" in body
