"""Media types: whether a request's Content-Type is one a task declares (`Task.content_types`)."""

from __future__ import annotations

from collections.abc import Sequence

JSON = "application/json"
JSON_TOO = ("", "application/x-www-form-urlencoded")
"""Taken where JSON is: no Content-Type at all, or the one `curl -d` sends by default (as KServe's
server does; the body must still parse as JSON)."""


def media_type_matches(media_type: str, accepted: Sequence[str]) -> bool:
    """`media_type` is one of `accepted` (`type/*` and `*/*` are wildcards); an empty `accepted` takes all."""
    if not accepted or media_type in accepted or "*/*" in accepted:
        return True
    return media_type.partition("/")[0] + "/*" in accepted


def accepted_by(media_type: str, content_types: Sequence[str]) -> bool:
    """A request of `media_type` may reach a task declaring `content_types` (else: 415)."""
    return media_type_matches(media_type, content_types) or (JSON in content_types and media_type in JSON_TOO)


def not_accepted(media_type: str, route: str, content_types: Sequence[str]) -> str:
    """The 415's message."""
    return f"Content-Type {media_type or 'missing'} is not accepted on {route}: send {' or '.join(content_types)}"
