"""One log format for gunicorn's master, workers, access lines and the app.

Returned as a `logconfig_dict` for gunicorn, so the master sets it up once and
every forked worker inherits it. A filter on the one handler stamps each record
logged during a request with that request's id (`server.request_id`), so app
lines carry `rid=...` like the access line does, and, when the request is traced
(`[tracing]`), its trace id beside it (`trace=<32 hex>`, the id a tracing UI
finds the trace by); in JSON mode the access line becomes structured fields
(method, path, status, duration, request id, trace id...).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson
from gunicorn.glogging import Logger

from onnxpool.config.settings import LoggingSettings
from onnxpool.server.request_id import RequestIdLogFilter

TEXT_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
ACCESS_FORMAT = '%(h)s "%(r)s" %(s)s %(B)s %(M)sms rid=%({x-request-id}o)s'
ACCESS_CALLER = " caller=%({x-onnxpool-caller}i)s"
"""Added when callers are told apart: the caller onnxpool's nginx found ("" none, "-" not through it)."""
ACCESS_LOGGER = "gunicorn.access"


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT, plus ` rid=<id>` on lines logged while serving a request, and ` trace=<id>` after it
    when the request is traced.

    The access line already has `rid=` from ACCESS_FORMAT, so it is not doubled.
    """

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", None)
        if rid is not None and record.name != ACCESS_LOGGER:
            line = f"{line} rid={rid}"
        trace = getattr(record, "trace_id", None)
        if trace is not None:
            line = f"{line} trace={trace}"
        return line


def _access_fields(atoms: Mapping[str, Any]) -> dict[str, Any]:
    """gunicorn's access atoms (the record's args) as JSON fields."""
    status = atoms.get("s")
    return {
        "remote": atoms.get("h"),
        "method": atoms.get("m"),
        "path": atoms.get("U"),
        "query": atoms.get("q") or None,
        "status": int(str(status)) if str(status).isdigit() else status,
        "bytes": atoms.get("B"),
        "duration_ms": round(atoms["D"] / 1000, 3) if isinstance(atoms.get("D"), int) else None,
        "user_agent": atoms.get("a"),
        "request_id": atoms.get("{x-request-id}o"),
        "caller": atoms.get("{x-onnxpool-caller}i") or None,
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, pid, logger, msg (+ request_id, exc; access fields)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "pid": record.process,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("request_id", "trace_id", "slot"):
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.name == ACCESS_LOGGER and isinstance(record.args, Mapping):
            entry["msg"] = record.args.get("r")
            entry.update((k, v) for k, v in _access_fields(record.args).items() if v not in (None, "-"))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


class GunicornLogger(Logger):  # type: ignore[misc]  # gunicorn ships no types
    """gunicorn's logger, minus the access line's cost when nothing would print it.

    With a `logconfig_dict`, gunicorn treats the access log as enabled and builds the
    line's atoms (a dict of ~20 formatted fields, a date string) for every request,
    even though `[logging] access_log = false` sets the access logger to CRITICAL and
    the line is then dropped: ~3 % of a worker's CPU on a response-cache hit.
    """

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        if self.access_log.isEnabledFor(logging.INFO):
            super().access(resp, req, environ, request_time)


def logconfig_dict(settings: LoggingSettings) -> dict[str, Any]:
    """dictConfig for gunicorn's `logconfig_dict` from the [logging] section."""
    level = settings.level.upper()
    formatter: dict[str, Any] = (
        {"()": f"{__name__}.JsonFormatter"}
        if settings.format == "json"
        else {"()": f"{__name__}.TextFormatter", "format": TEXT_FORMAT}
    )
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "onnxpool",
        "filters": ["request_id"],
        "stream": "ext://sys.stderr",
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdLogFilter}},
        "formatters": {"onnxpool": formatter},
        "handlers": {"stderr": handler},
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            "gunicorn.error": {
                "level": level,
                "handlers": ["stderr"],
                "propagate": False,
                "qualname": "gunicorn.error",
            },
            ACCESS_LOGGER: {
                "level": "INFO" if settings.access_log else "CRITICAL",
                "handlers": ["stderr"],
                "propagate": False,
                "qualname": ACCESS_LOGGER,
            },
        },
    }
