"""How long a request waited before this process saw it, from `X-Request-Start`.

nginx stamps the moment it received the request (`proxy_set_header
X-Request-Start "t=${msec}"`: Unix seconds with milliseconds, `t=1700000000.123`);
some proxies send integer microseconds (`t=1700000000123456`) or milliseconds.
The unit of a bare integer is told apart by its magnitude, which is unambiguous
for any date after 1973. Pure functions, no Flask. The WSGI middleware
(`server.instrument`) parses the header ONCE per request and keeps the stamp on
the request's timer (`server.timing`); the metrics (queue-time histogram,
Server-Timing) and admission control (shedding) read it from there.
"""

from __future__ import annotations

import math

HEADER = "X-Request-Start"
ENVIRON_KEY = "HTTP_X_REQUEST_START"  # the header as the WSGI environ spells it

# A stamp further than this from now is a wrong clock, not a queue wait: ignored.
MAX_PLAUSIBLE_SECONDS = 3600.0

# Integers above these are milliseconds / microseconds since the epoch (1e11 s is in year 5138).
_MILLIS_ABOVE = 1e11
_MICROS_ABOVE = 1e14


def parse_request_start(value: str | None) -> float | None:
    """`t=<stamp>` (or a bare stamp) -> Unix seconds, or None without one (no header, not a stamp)."""
    if value is None:
        return None
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


def seconds_since(stamp: float | None, now: float) -> float | None:
    """Seconds between a parsed stamp and `now` (Unix time); None without a stamp.

    A stamp slightly in the future (clocks of proxy and host disagree) counts as
    0; one more than an hour off either way is a wrong clock and gives None.
    """
    if stamp is None or abs(now - stamp) > MAX_PLAUSIBLE_SECONDS:
        return None
    return max(0.0, now - stamp)
