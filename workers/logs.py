"""One log format for gunicorn's master, workers, access lines and the app.

Returned as a `logconfig_dict` for gunicorn, so the master sets it up once and
every forked worker inherits it.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from config.settings import LoggingSettings

TEXT_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
ACCESS_FORMAT = '%(h)s "%(r)s" %(s)s %(B)s %(M)sms rid=%({x-request-id}o)s'


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, pid, logger, msg (+ exc)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "pid": record.process,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("request_id", "slot"):
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def logconfig_dict(settings: LoggingSettings) -> dict[str, Any]:
    """dictConfig for gunicorn's `logconfig_dict` from the [logging] section."""
    level = settings.level.upper()
    formatter: dict[str, Any] = (
        {"()": f"{__name__}.JsonFormatter"} if settings.format == "json" else {"format": TEXT_FORMAT}
    )
    handler = {"class": "logging.StreamHandler", "formatter": "onnxpool", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
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
            "gunicorn.access": {
                "level": "INFO" if settings.access_log else "CRITICAL",
                "handlers": ["stderr"],
                "propagate": False,
                "qualname": "gunicorn.access",
            },
        },
    }
