"""A CloudEvents HTTP sink for tests: a threaded http.server that decodes binary-mode events by the spec.

The CloudEvents HTTP protocol binding, binary content mode (spec v1.0, section 3.1): every context
attribute is a header `ce-<name>` (names lowercase, case-insensitive on the wire; values
percent-encoded where they are not printable ASCII), the event's data is the body, and
`datacontenttype` is the Content-Type header. An event lacking any required attribute (id,
source, specversion, type) is refused with 400, as a broker would. `delay` makes every POST
that slow (the slow-sink fault); `stop`/`start` take it down and up on the same port.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

REQUIRED = ("id", "source", "specversion", "type")


@dataclass(frozen=True)
class ReceivedEvent:
    attributes: dict[str, str]
    """Context attributes and extensions by name (`ce-` stripped), `datacontenttype` included."""
    data: bytes

    @property
    def id(self) -> str:
        return self.attributes["id"]

    @property
    def type(self) -> str:
        return self.attributes["type"]


class Receiver:
    """The sink (see the module doc)."""

    def __init__(self, delay: float = 0.0, port: int = 0) -> None:
        self.delay = delay
        self._events: list[ReceivedEvent] = []
        self._lock = threading.Lock()
        self.posts = 0
        self._server: ThreadingHTTPServer | None = None
        self._port = port

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}/"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the shipper's session expects

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                data = self.rfile.read(length)
                attributes = {
                    name.lower()[3:]: unquote(value)
                    for name, value in self.headers.items()
                    if name.lower().startswith("ce-")
                }
                if "Content-Type" in self.headers:
                    attributes["datacontenttype"] = self.headers["Content-Type"]
                if receiver.delay:
                    time.sleep(receiver.delay)
                missing = [name for name in REQUIRED if not attributes.get(name)]
                status = 400 if missing or attributes.get("specversion") != "1.0" else 202
                if status == 202:
                    with receiver._lock:
                        receiver._events.append(ReceivedEvent(attributes, data))
                with receiver._lock:
                    receiver.posts += 1
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        return Handler

    def events(self) -> list[ReceivedEvent]:
        with self._lock:
            return list(self._events)

    def wait_for(self, count: int, timeout: float = 15.0) -> list[ReceivedEvent]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.events()
            if len(events) >= count:
                return events
            time.sleep(0.05)
        return self.events()

    def start(self) -> Receiver:
        server = ThreadingHTTPServer(("127.0.0.1", self._port), self._handler())
        server.daemon_threads = True
        self._port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, name="cloudevents-receiver", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@contextmanager
def cloudevents_receiver(delay: float = 0.0) -> Iterator[Receiver]:
    receiver = Receiver(delay).start()
    try:
        yield receiver
    finally:
        receiver.stop()
