"""A reply as the data plane sends it: status, headers, body; rendered to WSGI in one place."""

from __future__ import annotations

from dataclasses import dataclass

from werkzeug.http import HTTP_STATUS_CODES

from onnxpool.tasks import jsonfast

JSON = "application/json"


@dataclass(slots=True)
class Reply:
    """Status, headers (Content-Type among them) and body of one reply."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    @classmethod
    def json(cls, document: object, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
        """A UTF-8 JSON reply (non-ASCII kept as is) written by orjson, as `server.context.json_response`."""
        return cls(status, [("Content-Type", JSON), *(headers or {}).items()], jsonfast.dumps(document))

    def header(self, name: str) -> str | None:
        """The first value of header `name` (exact spelling), or None."""
        return next((value for key, value in self.headers if key == name), None)

    def status_line(self) -> str:
        """`200 OK`, with the reason phrase werkzeug (and so Flask) would write."""
        return f"{self.status} {HTTP_STATUS_CODES.get(self.status, 'UNKNOWN')}"

    def wsgi_headers(self) -> list[tuple[str, str]]:
        """The headers with Content-Length, as a WSGI server wants them."""
        return [*self.headers, ("Content-Length", str(len(self.body)))]
