"""How a reply leaves a gunicorn worker: in one TCP segment, with a Date header made once a second.

Two costs that gunicorn (27) pays per reply and that showed in a profile of a worker
serving `/predict` (py-spy, INT8 model, 4 connections; docs/BENCHMARKS.md):

- It writes the status line and headers with one send() and the body with another.
  On a TCP connection the first send already transmits a segment and wakes the client,
  which finds no body yet and sleeps again; the second send repeats all of it. The header
  send alone was 5 % of the worker's time. Holding the socket corked (TCP_CORK) from
  the moment the app starts its reply until the reply is complete (`post_request`) makes
  the kernel send headers and body together. The cork is always taken off in
  post_request, which gunicorn runs after every request (sync and gthread workers), and
  closing a socket flushes it anyway; a corked socket is never left waiting for the
  kernel's 200 ms cork timer.
- It formats the Date header with `email.utils.formatdate` for every reply (1.5 %).
  `cache_http_date` swaps gunicorn's `util.http_date` for one that formats once per
  second; the header's resolution is one second anyway (RFC 9110 IMF-fixdate).

Both are Linux/TCP details and fail soft: a Unix socket, a platform without TCP_CORK or
a client that already left only skip the optimisation.
"""

from __future__ import annotations

import contextlib
import email.utils
import socket
import time
from typing import Any

_CORK: int | None = getattr(socket, "TCP_CORK", None)
SOCKET_KEY = "gunicorn.socket"  # gunicorn puts the client socket into every WSGI environ


def cork(environ: dict[str, Any]) -> None:
    """Hold this request's reply in the kernel until `uncork` (the app is about to reply)."""
    _set_cork(environ.get(SOCKET_KEY), 1)


def uncork(sock: Any) -> None:
    """Send what is held (after the whole reply was written)."""
    _set_cork(sock, 0)


def _set_cork(sock: Any, value: int) -> None:
    if _CORK is None or not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):  # the client may be gone already
        sock.setsockopt(socket.IPPROTO_TCP, _CORK, value)


class _HttpDate:
    """`gunicorn.util.http_date` that formats the current time once per second."""

    def __init__(self) -> None:
        self.second = -1
        self.text = ""

    def __call__(self, timestamp: float | None = None) -> str:
        if timestamp is not None:
            return email.utils.formatdate(timestamp, localtime=False, usegmt=True)
        now = int(time.time())
        if now != self.second:
            self.text = email.utils.formatdate(now, localtime=False, usegmt=True)
            self.second = now
        return self.text


def cache_http_date() -> None:
    """Replace gunicorn's per-reply Date formatting (its response code calls `util.http_date()`)."""
    from gunicorn import util

    if not isinstance(util.http_date, _HttpDate):
        util.http_date = _HttpDate()
