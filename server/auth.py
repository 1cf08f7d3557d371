"""Optional API-key access control: `Authorization: Bearer <key>`.

Off unless `[auth] api_keys` or `api_keys_file` names at least one key. Keys are
kept only as SHA-256 digests (config/callers.py); a presented key is hashed and
compared with `hmac.compare_digest` against EVERY configured digest (no early
exit), so the time taken says nothing about which key, or how much of one,
matched. The key names the request's caller.
Health probes, /openapi.json and the /docs page stay open; /metrics too when `protect_metrics = false`. Keys are
never logged: the access log does not record request headers, and
`onnxpool config` prints them masked (`mask_key`).
"""

from __future__ import annotations

from flask import Flask
from werkzeug.wrappers import Request

from onnxpool.config.callers import CallerBook
from onnxpool.server import gates
from onnxpool.server.gates import Gate
from onnxpool.server.request_state import RequestState
from onnxpool.tasks.errors import Unauthorized

OPEN_PREFIXES = ("/v2/health/", "/openapi.json", "/docs")  # /docs: the page and its files (static)
METRICS_PATH = "/metrics"
CHALLENGE = 'Bearer realm="onnxpool"'
AUTH_KEY = "onnxpool.auth"


def mask_key(key: str) -> str:
    """A key as it may appear in output: its length only."""
    return f"<{len(key)}-char key>"


def bearer_token(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def gate(book: CallerBook, protect_metrics: bool) -> Gate:
    """The check (server.gates): 401 unless the path is open or the request carries a configured key;
    the key's caller is the request's (RequestState.caller)."""

    def check_api_key(req: Request) -> None:
        path = req.path
        if path.startswith(OPEN_PREFIXES) or (path == METRICS_PATH and not protect_metrics):
            return
        token = bearer_token(req.headers.get("Authorization"))
        if token is None:
            raise Unauthorized(
                "missing API key: send 'Authorization: Bearer <key>'", headers={"WWW-Authenticate": CHALLENGE}
            )
        caller = book.caller_of_key(token)
        if caller is None:
            raise Unauthorized("invalid API key", headers={"WWW-Authenticate": CHALLENGE + ', error="invalid_token"'})
        RequestState.of(req.environ).caller = caller

    return check_api_key


def install(app: Flask, book: CallerBook, protect_metrics: bool) -> bool:
    """Add the check to the app's gates when keys are configured; return whether auth is on."""
    if not book.digests:
        return False
    app.extensions[AUTH_KEY] = book  # also tells the OpenAPI document that keys are required
    gates.add(app, gate(book, protect_metrics))
    return True
