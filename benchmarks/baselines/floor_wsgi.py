"""BASELINE, not onnxpool: the cheapest possible gunicorn app, to measure gunicorn's own floor.

It reads the request body and returns 4 KB (the size of a 1000-class FP32
reply; `FLOOR_REPLY_BYTES` sets another size), doing nothing else: no Flask, no model. Requests/s against it show
what accept + HTTP parsing + body read + reply + close cost per request on
this machine; `benchmarks/floor.py` starts it and measures it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

# 4 KB by default; benchmarks.cache sets the size of a /predict reply instead.
REPLY = b"\0" * int(os.environ.get("FLOOR_REPLY_BYTES", "4000"))


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    environ["wsgi.input"].read(length)
    start_response("200 OK", [("Content-Type", "application/octet-stream"), ("Content-Length", str(len(REPLY)))])
    return [REPLY]
