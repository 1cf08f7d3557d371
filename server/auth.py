"""Optional API-key access control: `Authorization: Bearer <key>`.

Off unless `[auth] api_keys` or `api_keys_file` names at least one key. Keys are
kept only as SHA-256 digests; a presented key is hashed and compared with
`hmac.compare_digest` against EVERY configured digest (no early exit), so the
time taken says nothing about which key, or how much of one, matched.
Health probes, /openapi.json and the /docs page stay open; /metrics too when `protect_metrics = false`. Keys are
never logged: the access log does not record request headers, and
`onnxpool config` prints them masked (`mask_key`).
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from flask import Flask
from werkzeug.wrappers import Request

from onnxpool.config.loader import ConfigError
from onnxpool.config.settings import AuthSettings
from onnxpool.server import gates
from onnxpool.server.gates import Gate
from onnxpool.tasks.errors import Unauthorized

OPEN_PREFIXES = ("/v2/health/", "/openapi.json", "/docs")  # /docs: the page and its files (static)
METRICS_PATH = "/metrics"
CHALLENGE = 'Bearer realm="onnxpool"'
AUTH_KEY = "onnxpool.auth"


class AuthConfigError(ConfigError):
    """The keys file is missing, unreadable or holds no key (one-line message)."""


def mask_key(key: str) -> str:
    """A key as it may appear in output: its length only."""
    return f"<{len(key)}-char key>"


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


def read_keys_file(path: Path) -> list[str]:
    """Keys from a file: one per line, blank lines and `#` comments ignored."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthConfigError(f"auth.api_keys_file {path} cannot be read: {exc}") from None
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise AuthConfigError(f"auth.api_keys_file {path} holds no key")
    for number, key in enumerate(keys, 1):
        if len(key) < 16 or any(c.isspace() for c in key) or not key.isprintable():
            raise AuthConfigError(f"auth.api_keys_file {path} line {number}: keys need 16+ printable non-space chars")
    return keys


class KeyChecker:
    """The configured keys as digests, and the constant-time check."""

    def __init__(self, keys: list[str] | tuple[str, ...]) -> None:
        self._digests = tuple(_digest(k) for k in dict.fromkeys(keys))

    @classmethod
    def from_settings(cls, settings: AuthSettings) -> KeyChecker:
        keys = list(settings.api_keys)
        if settings.api_keys_file is not None:
            keys.extend(read_keys_file(settings.api_keys_file))
        return cls(keys)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def accepts(self, presented: str) -> bool:
        candidate = _digest(presented.encode("utf-8", "surrogateescape"))
        matched = False
        for digest in self._digests:
            matched |= hmac.compare_digest(candidate, digest)
        return matched


def _bearer_token(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def gate(checker: KeyChecker, protect_metrics: bool) -> Gate:
    """The check (server.gates): 401 unless the path is open or the request carries a configured key."""

    def check_api_key(req: Request) -> None:
        path = req.path
        if path.startswith(OPEN_PREFIXES) or (path == METRICS_PATH and not protect_metrics):
            return
        token = _bearer_token(req.headers.get("Authorization"))
        if token is None:
            raise Unauthorized(
                "missing API key: send 'Authorization: Bearer <key>'", headers={"WWW-Authenticate": CHALLENGE}
            )
        if not checker.accepts(token):
            raise Unauthorized("invalid API key", headers={"WWW-Authenticate": CHALLENGE + ', error="invalid_token"'})

    return check_api_key


def install(app: Flask, settings: AuthSettings) -> bool:
    """Add the check to the app's gates when keys are configured; return whether auth is on."""
    checker = KeyChecker.from_settings(settings)
    if not checker.enabled:
        return False
    app.extensions[AUTH_KEY] = checker  # also tells the OpenAPI document that keys are required
    gates.add(app, gate(checker, settings.protect_metrics))
    return True
