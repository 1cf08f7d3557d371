"""A request as a task may read it (`onnxpool.tasks.api.RequestParts`), over werkzeug: the task never sees HTTP."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from werkzeug.datastructures import Headers, MultiDict
from werkzeug.wrappers import Request

from onnxpool.tasks.errors import BadRequest, PayloadTooLarge


class _FirstValues(Mapping[str, str]):
    """A query's first value per name; `get` without werkzeug's raise-and-catch on a missing name."""

    __slots__ = ("_args",)

    def __init__(self, args: MultiDict[str, str]) -> None:
        self._args = args

    def __getitem__(self, name: str) -> str:
        return self._args[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self._args[name] if name in self._args else default

    def __contains__(self, name: object) -> bool:
        return name in self._args

    def __iter__(self) -> Iterator[str]:
        return iter(self._args)

    def __len__(self) -> int:
        return len(self._args)


class _Headers(Mapping[str, str]):
    """werkzeug's request headers as a read-only mapping (names case-insensitive; werkzeug's own
    iterates (name, value) pairs, which a Mapping must not)."""

    __slots__ = ("_headers",)

    def __init__(self, headers: Headers) -> None:
        self._headers = headers

    def __getitem__(self, name: str) -> str:
        value = self._headers.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def get(self, name: str, default: Any = None) -> Any:
        return self._headers.get(name, default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._headers

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers.keys())

    def __len__(self) -> int:
        return len(self._headers)


class HttpRequestParts:
    """`RequestParts` of one werkzeug request: its route, content type, query, and its body read once."""

    __slots__ = ("_body", "_max_body", "_mimetype", "_request", "route")

    def __init__(self, req: Request, route: str, max_body: int) -> None:
        self._request = req
        self._max_body = max_body
        self._body: bytes | None = None
        self._mimetype: str | None = None
        self.route = route

    @property
    def content_type(self) -> str:
        return self._request.content_type or ""

    @property
    def mimetype(self) -> str:
        # What werkzeug's `mimetype` gives, without its full parse of the parameters; asked twice per
        # request (the server's content_types check, then the task), worked out once.
        if self._mimetype is None:
            self._mimetype = self.content_type.partition(";")[0].strip().lower()
        return self._mimetype

    @property
    def query(self) -> Mapping[str, str]:
        return _FirstValues(self._request.args)

    @property
    def headers(self) -> Mapping[str, str]:
        return _Headers(self._request.headers)

    def header(self, name: str) -> str | None:
        """A request header (for the server's own operations, such as v2 infer's binary header length)."""
        return self._request.headers.get(name)

    @property
    def body_read(self) -> bytes | None:
        """The body if it was read (the inference log's copy of it: none is made), else None."""
        return self._body

    def body(self) -> bytes:
        if self._body is None:
            self._body = read_body(self._request, self._max_body)
        return self._body


def read_body(req: Request, limit: int) -> bytes:
    """The request body, refused with 413 beyond `limit` ([server] max_body_bytes), chunked or not.

    For a chunked body werkzeug's stream ends quietly at the request's `max_content_length`
    (a truncated body, no error; the data plane sets it one byte past the limit), so reading
    through it is not enough on its own.
    """
    environ = req.environ
    length = req.content_length
    if length is not None:
        # Known length (already checked against the limit by the body-size gate):
        # one read straight from the server's input stream. gunicorn then recv()s
        # in large steps; going through werkzeug's stream wrapper reads 64 KiB at a
        # time, which costs ~0.5 ms per 600 KB tensor body.
        data: bytes = environ["wsgi.input"].read(length)
        if len(data) != length:
            raise BadRequest(f"request body ended after {len(data)} of the {length} bytes in Content-Length")
    else:
        data = req.get_data(cache=False)
        if len(data) > limit:
            raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes ([server] max_body_bytes)")
    return data
