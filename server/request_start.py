"""How long a request waited before this process saw it, from `X-Request-Start`.

nginx stamps the moment it received the request (`proxy_set_header
X-Request-Start "t=${msec}"`: Unix seconds with milliseconds, `t=1700000000.123`);
some proxies send integer microseconds (`t=1700000000123456`) or milliseconds.
The unit of a bare integer is told apart by its magnitude, which is unambiguous
for any date after 1973. Pure functions, no Flask: admission control (shedding)
and the metrics (a queue-time histogram) both use `queue_seconds`.
"""

from __future__ import annotations

import math
from typing import Protocol

HEADER = "X-Request-Start"

# A stamp further than this from now is a wrong clock, not a queue wait: ignored.
MAX_PLAUSIBLE_SECONDS = 3600.0

# Integers above these are milliseconds / microseconds since the epoch (1e11 s is in year 5138).
_MILLIS_ABOVE = 1e11
_MICROS_ABOVE = 1e14


def parse_request_start(value: str) -> float | None:
    """`t=<stamp>` (or a bare stamp) -> Unix seconds, or None if it is not a stamp."""
    text = value.strip()
    if text[:2] in ("t=", "T="):
        text = text[2:].strip()
    if not text or len(text) > 32 or not text.replace(".", "", 1).isdigit():
        return None
    stamp = float(text)
    if not math.isfinite(stamp) or stamp <= 0:
        return None
    if "." not in text:
        if stamp > _MICROS_ABOVE:
            stamp /= 1e6
        elif stamp > _MILLIS_ABOVE:
            stamp /= 1e3
    return stamp


class Headers(Protocol):
    """Anything with `.get(name)`: werkzeug's request.headers, or a dict."""

    def get(self, key: str, /) -> str | None: ...


def queue_seconds(headers: Headers, now: float) -> float | None:
    """Seconds between the `X-Request-Start` stamp and `now` (Unix time); None without one.

    A stamp slightly in the future (clocks of proxy and host disagree) counts as
    0; one more than an hour off either way is a wrong clock and gives None.
    `headers` is any case-insensitive mapping such as werkzeug's request.headers;
    a plain dict should use the canonical spelling `X-Request-Start`.
    """
    raw = headers.get(HEADER)
    if raw is None:
        return None
    start = parse_request_start(raw)
    if start is None or abs(now - start) > MAX_PLAUSIBLE_SECONDS:
        return None
    return max(0.0, now - start)
