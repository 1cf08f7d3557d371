"""Watching a host's pools: each model's state, and the routes nginx sends to it.

One watcher for both front doors of several models: the host process (host/controller.py, whose
supervisord says when a pool's master runs) and the pod's front door (host/pod_front_door.py, whose
models are containers the kubelet runs). Each knows by its own means whether a pool's process is up;
both then ask the pool the same way whether it is READY, follow its routes the same way and say so
the same way. A pool is routed from its first READY on: nginx keeps its route while it restarts (its
requests then get nginx's 502/503), so a restart reloads nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from onnxpool import probe
from onnxpool.config.settings import ModelEntry
from onnxpool.host.front_door import PoolRoute
from onnxpool.host.state import description_stamp, pool_routes
from onnxpool.server.model_states import LOADING, READY, UNAVAILABLE

PROBE_SECONDS = 1.0

log = logging.getLogger("onnxpool.host")


@dataclass
class WatchedPool:
    """One model's pool as a front door sees it."""

    name: str
    entry: ModelEntry
    address: str
    state: str = LOADING
    reason: str = ""
    routes: tuple[str, ...] = ()
    """Its task's routes (its pool's description)."""
    lanes: int = 0
    """Callers' lanes its pool bound beside its socket (its description)."""
    described: int = 0
    """The stamp of its pool's description when its routes were read (its master rewrites it at a HUP)."""
    routed: bool = False
    """It answered ready once: nginx routes to it from then on."""
    starts: int = 0

    def route(self) -> PoolRoute:
        return PoolRoute(
            name=self.name, aliases=self.entry.aliases, address=self.address, routes=self.routes, lanes=self.lanes
        )


def set_state(pool: WatchedPool, state: str, reason: str) -> bool:
    """Its state and why (one line when it becomes READY or UNAVAILABLE); True when that changed."""
    if (pool.state, pool.reason) == (state, reason):
        return False
    if state == READY:
        log.info("model %s: READY", pool.name)
    elif state == UNAVAILABLE:
        log.error("model %s: UNAVAILABLE: %s", pool.name, reason)
    pool.state, pool.reason = state, reason
    return True


def answers_ready(folder: Path, pool: WatchedPool) -> bool:
    """One probe of its pool's /v2/health/ready; when it answers, its routes are read and it is routed."""
    if probe.probe(pool.address, "/v2/health/ready", timeout=PROBE_SECONDS) is not None:
        return False
    read_routes(folder, pool)
    pool.routed = True
    return True


def follow_routes(folder: Path, pool: WatchedPool) -> None:
    """A ready pool whose master wrote a new description (a HUP replaced its task): read its routes again."""
    if description_stamp(folder, pool.name) != pool.described:
        read_routes(folder, pool)


def read_routes(folder: Path, pool: WatchedPool) -> None:
    pool.described, pool.routes, pool.lanes = pool_routes(folder, pool.name)
