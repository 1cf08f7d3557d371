"""One exception tree for everything a client can get wrong, each carrying its status.

Routes raise these; ONE handler (in `server.app`) renders `{"error": message}`.
Lower-level errors (numpy, Pillow, orjson) are translated at the boundary with
`raise ... from None`, so a client only ever sees this vocabulary.
"""

from __future__ import annotations


class OnnxpoolError(Exception):
    """Base: a request failed for a reason the client can act on."""

    status: int = 400

    def __init__(self, message: str, *, headers: dict[str, str] | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = headers or {}
        if status is not None:  # an HTTP-layer error (404, 405, 500) rendered through the same handler
            self.status = status


class BadRequest(OnnxpoolError):
    """The request is malformed or does not match the model (400)."""

    status = 400


class Unauthorized(OnnxpoolError):
    """Missing or wrong API key (401)."""

    status = 401


class Forbidden(OnnxpoolError):
    """The caller is known but may not use this model (its `[caller.<name>] models`)."""

    status = 403


class NotFound(OnnxpoolError):
    """Unknown model, version or route (404)."""

    status = 404


class PayloadTooLarge(OnnxpoolError):
    """Body, image or tensor exceeds a configured limit (413)."""

    status = 413


class UnsupportedMediaType(OnnxpoolError):
    """Content-Type or image format the endpoint cannot read (415)."""

    status = 415


class Unprocessable(OnnxpoolError):
    """Well-formed, but the content cannot be used, e.g. a truncated image (422)."""

    status = 422


class Unavailable(OnnxpoolError):
    """The worker cannot serve right now: model not loaded or request shed (503)."""

    status = 503
