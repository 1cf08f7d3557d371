"""The FastAPI baseline's uvicorn launcher really gives its connections TCP_NODELAY (uvicorn #3149)."""

from __future__ import annotations

import asyncio
import socket

import pytest

uvicorn_config = pytest.importorskip("uvicorn.config")

from benchmarks.baselines.uvicorn_nodelay import bind_socket_with_tcp_protocol  # noqa: E402


async def _nodelay_of_accepted(listener: socket.socket) -> int:
    """Serve one connection on `listener` with asyncio (as uvicorn does) and report its TCP_NODELAY."""
    seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Report(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Report, sock=listener)
    port = listener.getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await asyncio.wait_for(seen, 5)
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


def test_launcher_socket_reports_tcp_and_accepted_connections_get_nodelay() -> None:
    config = uvicorn_config.Config("benchmarks.baselines.fastapi_app:app", host="127.0.0.1", port=0)
    listener = bind_socket_with_tcp_protocol(config)
    assert listener.family == socket.AF_INET
    assert listener.proto == socket.IPPROTO_TCP
    assert asyncio.run(_nodelay_of_accepted(listener)) == 1


def test_launcher_leaves_unix_sockets_alone(tmp_path: object) -> None:
    path = f"{tmp_path}/baseline.sock"
    config = uvicorn_config.Config("benchmarks.baselines.fastapi_app:app", uds=path)
    listener = bind_socket_with_tcp_protocol(config)
    try:
        assert listener.family == socket.AF_UNIX
    finally:
        listener.close()
