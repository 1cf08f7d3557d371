"""onnxpool.wire: the cork around a reply and gunicorn's Date header made once a second."""

from __future__ import annotations

import email.utils
import socket
import time

import pytest
from gunicorn import util

from onnxpool import wire


@pytest.mark.skipif(not hasattr(socket, "TCP_CORK"), reason="TCP_CORK is Linux-only")
def test_cork_and_uncork_a_real_tcp_socket() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with client, accepted:
            wire.cork({wire.SOCKET_KEY: accepted})
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 1
            accepted.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
            accepted.sendall(b"ok")
            wire.uncork(accepted)
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
            client.settimeout(5)
            received = b""
            while not received.endswith(b"ok"):
                received += client.recv(1024)
            assert received == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def test_cork_skips_what_is_not_a_tcp_socket() -> None:
    a, b = socket.socketpair()  # AF_UNIX: TCP options do not apply
    with a, b:
        wire.cork({wire.SOCKET_KEY: a})
        wire.uncork(a)
    wire.cork({})  # outside gunicorn: no socket in the environ
    wire.uncork(None)
    closed = socket.socket()
    closed.close()
    wire.uncork(closed)  # a client that already left


def test_http_date_is_gunicorns_format_made_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    original = util.http_date
    try:
        wire.cache_http_date()
        cached = util.http_date
        assert cached is not original
        wire.cache_http_date()  # idempotent
        assert util.http_date is cached
        assert cached(1_700_000_000.5) == original(1_700_000_000.5)
        now = [1_700_000_000.2]
        monkeypatch.setattr(time, "time", lambda: now[0])
        first = cached()
        assert first == email.utils.formatdate(1_700_000_000, usegmt=True) == "Tue, 14 Nov 2023 22:13:20 GMT"
        now[0] = 1_700_000_000.9
        assert cached() == first
        now[0] = 1_700_000_001.0
        assert cached() == "Tue, 14 Nov 2023 22:13:21 GMT"
    finally:
        util.http_date = original
