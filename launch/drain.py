"""On SIGTERM, keep serving until the nginx in front (same pod) has finished, then drain.

Why: in a pod both containers get SIGTERM at the same moment. gunicorn's own
SIGTERM closes its socket at once and lets only the requests its workers hold
finish; requests nginx still holds (a body still arriving, a request waiting for
a free worker) would then find no server and fail. nginx, told to stop gracefully
(`onnxpool nginx` turns its SIGTERM into SIGQUIT), stops accepting and finishes
every request it has, then deletes its pid file. So the master, on SIGTERM, first
waits until `[nginx] pidfile` is gone (bounded by server.graceful_timeout) and
only then runs gunicorn's usual graceful stop, which by then has nothing left to wait for.

Process rules: the wait runs in the master's main loop (gunicorn handles signals
there, not in the signal handler), so while it waits the master neither reaps
nor replaces workers; the workers keep serving on the still-open socket. A worker
that dies in that window is replaced by nobody: acceptable for a bounded wait at
the end of the pod's life.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("onnxpool")
POLL_SECONDS = 0.1


def wait_until_gone(path: Path, limit: float) -> tuple[bool, float]:
    """Poll until `path` does not exist or `limit` seconds passed: (gone, seconds waited)."""
    t0 = time.monotonic()
    while path.exists():
        waited = time.monotonic() - t0
        if waited >= limit:
            return False, waited
        time.sleep(POLL_SECONDS)
    return True, time.monotonic() - t0


def hold_term_for_proxy(server: Any, pidfile: Path, limit: float) -> None:
    """Wrap the gunicorn Arbiter's SIGTERM handling: wait for `pidfile` to vanish first."""
    original: Callable[[], None] = server.handle_term

    def handle_term() -> None:
        if pidfile.exists():
            log.info("SIGTERM: serving until nginx has finished its requests (%s gone, at most %g s)", pidfile, limit)
        gone, waited = wait_until_gone(pidfile, limit)
        if gone:
            log.info("nginx finished after %.1f s; draining", waited)
        else:
            log.warning("nginx still running after %.1f s (%s exists); draining anyway", waited, pidfile)
        original()

    server.handle_term = handle_term
