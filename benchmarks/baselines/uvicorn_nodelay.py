"""BASELINE launcher: the `uvicorn` command with one upstream bug worked around.

    python -m benchmarks.baselines.uvicorn_nodelay benchmarks.baselines.fastapi_app:app --workers 2 --port 8001

takes exactly uvicorn's command-line arguments. Why it exists: with
`--workers N` uvicorn binds the listening socket itself and leaves its
protocol number at 0; accepted connections inherit it, and asyncio turns on
TCP_NODELAY only for sockets that report IPPROTO_TCP (uvicorn issue #3149, open
in uvicorn 0.54). Nagle's algorithm then holds back each reply until the
client's delayed ACK, about 40 ms on Linux, on every keep-alive request after
the first. On the demo model that turns ~12 ms per request into ~52 ms at one
connection. onnxpool's comparison is about the architecture (oversubscribed
default thread pools, inference on the event loop), not about that bug, so
`benchmarks/compare.py` measures the baseline through this launcher; `--baseline
stock` measures plain `uvicorn` for reference.
"""

from __future__ import annotations

import socket
import sys

import uvicorn.config
import uvicorn.main

_bind_socket = uvicorn.config.Config.bind_socket


def bind_socket_with_tcp_protocol(self: uvicorn.config.Config) -> socket.socket:
    """uvicorn's own bind, then the same descriptor re-wrapped with proto=IPPROTO_TCP.

    Sockets accepted from it inherit the protocol number, so asyncio sets
    TCP_NODELAY on every connection, as it does for `uvicorn --workers 1`.
    """
    sock = _bind_socket(self)
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return sock
    return socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())


def install() -> None:
    """Patch uvicorn in this process (the supervisor binds; workers get the fixed socket)."""
    uvicorn.config.Config.bind_socket = bind_socket_with_tcp_protocol  # type: ignore[method-assign, unused-ignore]


def main() -> None:
    install()
    uvicorn.main.main()


if __name__ == "__main__":
    sys.argv[0] = "uvicorn"
    main()
