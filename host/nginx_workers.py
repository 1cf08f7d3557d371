"""An nginx master's workers, from /proc: how a front door knows its reload has taken effect.

nginx answers a HUP at once and changes over in the background: it starts workers on the new files,
then tells the old ones to finish what they hold and exit. A host that stops a removed model's pool
must wait for the old workers to be gone (they may still send that pool a request), and a front door
that says a model is routed must wait for the new ones (host/controller.py, host/pod_front_door.py).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

log = logging.getLogger("onnxpool.host")

POLL_SECONDS = 0.01


def nginx_workers(master: int) -> set[int]:
    """The master's children now (its workers and cache helpers); none for no master."""
    if master <= 0:
        return set()
    try:
        text = Path(f"/proc/{master}/task/{master}/children").read_text()
    except OSError:
        return set()
    return {int(pid) for pid in text.split()}


def await_new_workers(master: int, before: set[int], seconds: float) -> bool:
    """Until every worker of the master is one started after `before` was taken: the new ones run on the
    new files, and the old ones have finished what they held and exited. False when `seconds` passed
    first (or the master is gone)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        workers = nginx_workers(master)
        if workers - before and not workers & before:
            return True
        if not workers and not Path(f"/proc/{master}").exists():
            return False
        time.sleep(POLL_SECONDS)
    log.warning("front door: nginx's reload did not finish within %g s", seconds)
    return False
