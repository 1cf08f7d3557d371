"""A minimal HTTP/1.1 client connection for the load generator: one sendall, one parse.

`http.client` costs ~0.6 ms of CPU per request (header objects, email parser),
which on a 2-core box is CPU taken from the server being measured. This sends
pre-built request bytes and reads exactly Content-Length bytes back; it serves
servers that answer with Content-Length (onnxpool, uvicorn), and counts any
other reply as an error rather than guessing.
"""

from __future__ import annotations

import http.client
import socket

from onnxpool.measure.payloads import PreparedRequest

_HEADER_END = b"\r\n\r\n"


def wire_bytes(request: PreparedRequest, host: str, port: int) -> bytes:
    """The request exactly as sent: request line, headers, blank line, body."""
    headers = {"Host": f"{host}:{port}", **request.headers, "Content-Length": str(len(request.body))}
    head = f"{request.method} {request.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + b"\r\n" + request.body


class RawConnection:
    """One keep-alive connection; reconnects when the server closed it."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.address = (host, port)
        self.timeout = timeout
        self.sock: socket.socket | None = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def exchange(self, wire: bytes) -> int:
        """Send one request, read the whole reply, return its status code."""
        if self.sock is None:
            self.sock = socket.create_connection(self.address, self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = self.sock
        sock.sendall(wire)
        buffer = bytearray()
        while _HEADER_END not in buffer:
            chunk = sock.recv(65536)
            if not chunk:
                # the server closed a kept-alive connection: the caller may retry once
                self.close()
                raise http.client.RemoteDisconnected("connection closed before the reply")
            buffer += chunk
        head, _, body = bytes(buffer).partition(_HEADER_END)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = {name.strip().lower(): value.strip() for name, _, value in (ln.partition(":") for ln in lines[1:])}
        if "content-length" not in fields:
            self.close()
            raise http.client.HTTPException("reply without Content-Length")
        missing = int(fields["content-length"]) - len(body)
        while missing > 0:
            chunk = sock.recv(min(missing, 1 << 20))
            if not chunk:
                self.close()
                raise http.client.IncompleteRead(b"", missing)
            missing -= len(chunk)
        if fields.get("connection", "").lower() == "close" or lines[0].startswith("HTTP/1.0"):
            self.close()
        return status
