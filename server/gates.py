"""Request gates: the checks a request passes before any route runs (body size, API key, admission).

A gate is a plain function of a werkzeug `Request` that raises an `OnnxpoolError` to
refuse it; the app keeps its gates in one ordered list (`app.extensions`). A request takes
one of two paths and the list runs once on it: in the data plane (`server.dataplane`: every
request that runs the model, a cache hit included, so a hit is refused exactly when a
computed reply would be), or in Flask's single before_request hook (everything else).

Order matters and is the order of `add`: the size (no body read), then who is
asking, then whether the request is still worth serving.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from flask import Flask, current_app, request
from werkzeug.wrappers import Request

from onnxpool.tasks.errors import PayloadTooLarge

Gate = Callable[[Request], None]
GATES_KEY = "onnxpool.gates"


def add(app: Flask, gate: Gate) -> None:
    """Append a gate to the app's list (the first one also installs the before_request hook)."""
    gates: list[Gate] | None = app.extensions.get(GATES_KEY)
    if gates is None:
        gates = app.extensions[GATES_KEY] = []
        app.before_request(_run_in_flask)
    gates.append(gate)


def of(app: Flask) -> Sequence[Gate]:
    """The app's gates, in order."""
    gates: list[Gate] = app.extensions.get(GATES_KEY, [])
    return gates


def run(gates: Sequence[Gate], req: Request) -> None:
    """Pass `req` through every gate in order; the first refusal raises."""
    for gate in gates:
        gate(req)


def _run_in_flask() -> None:
    run(of(current_app), request)


def body_size(limit: int) -> Gate:
    """Refuse an oversized body from its Content-Length, before reading a byte of it."""

    def check_body_size(req: Request) -> None:
        length = req.content_length
        if length is not None and length > limit:
            raise PayloadTooLarge(f"request body is {length} bytes; the limit is {limit} ([server] max_body_bytes)")

    return check_body_size
