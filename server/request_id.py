"""The request id: taken from `X-Request-ID` when it is sane, else a fresh uuid4 hex.

nginx can set the header (`proxy_set_header X-Request-ID $request_id;`), so one
id follows a request through nginx, onnxpool and the caller's logs. The id of
the request being served lives in a contextvar (one per thread, so gthread
workers are fine) that the logging filter below copies onto every log record;
so does the request's trace id when it is traced (`server.tracing_spans`).
"""

from __future__ import annotations

import logging
import re
import uuid
from contextvars import ContextVar

HEADER = "X-Request-ID"
ENVIRON_KEY = "HTTP_X_REQUEST_ID"
MAX_LENGTH = 128

# Letters, digits and a few separators: enough for uuids, nginx's hex ids and
# trace ids; nothing that could break a log line or a header.
_VALID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_LENGTH}}}")

_current: ContextVar[str | None] = ContextVar("onnxpool_request_id", default=None)
_trace: ContextVar[str | None] = ContextVar("onnxpool_trace_id", default=None)


def from_header(value: str | None) -> str:
    """The incoming id if it is 1..128 characters of [A-Za-z0-9._:-]; otherwise a new one."""
    if value is not None and _VALID.fullmatch(value):
        return value
    return uuid.uuid4().hex


def current() -> str | None:
    """The id of the request this thread is serving, or None outside a request."""
    return _current.get()


def set_current(value: str | None) -> None:
    """Mark the start (an id) or the end (None) of a request in this thread (its trace id ends too)."""
    _current.set(value)
    if value is None:
        _trace.set(None)


def set_trace(trace_id: str) -> None:
    """The trace (32 hex digits) of the request this thread serves, for its log lines."""
    _trace.set(trace_id)


class RequestIdLogFilter(logging.Filter):
    """Adds `request_id` (and `trace_id` when traced) to records logged while a request is being served.

    Installed on the log handler by `onnxpool.logs.logconfig_dict`, so app lines,
    gunicorn's error lines and its access line (written before the request ends)
    all carry the id of their request.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        rid = _current.get()
        if rid is not None and not hasattr(record, "request_id"):
            record.request_id = rid
            trace = _trace.get()
            if trace is not None:
                record.trace_id = trace
        return True
