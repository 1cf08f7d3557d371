"""What a host serving several models writes down, and its pools tell it: small files in its run folder.

    <host run folder>/
        host.json           the host's models: name, version, aliases, address (and gRPC address), plan, state and its
                            reason, whether the host's readiness waits for it (written by the host)
        pools/<name>.json   one pool's task routes and OpenAPI document (written by that pool's master
                            at each config load: the host routes nginx and describes the API from it)
        pools/<name>.sock   the pool's socket (unless [models.<name>] bind names an address)
        pools/<name>.error  the last error line its pool printed before it exited (the state's reason)
        programs/<p>.pgid   the process group of each program supervisord runs (host/program.py)
        metrics/<name>/     the pool's prometheus_client files (one /metrics sums every pool's)
        nginx/              the front door's configuration, pid and temp files
        supervisor/         supervisord's configuration, control socket and log

Files are replaced atomically (written beside, then renamed), so a reader never sees half of one.
The host's routes (host/routes.py) read host.json per request: one small file, no request to a pool.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from onnxpool.server.model_states import ServedModel

HOST_FILE = "host.json"
POOLS_DIR = "pools"
METRICS_DIR = "metrics"
NGINX_DIR = "nginx"
PROGRAMS_DIR = "programs"
SUPERVISOR_DIR = "supervisor"


@dataclass(frozen=True)
class HostModel(ServedModel):
    """One model of the host: what the model lists show (name, version, aliases, state, reason) and
    what the host planned and watches."""

    address: str = ""
    grpc_address: str = ""
    """Where its pool's workers serve gRPC (a loopback port the host gave it at start; the host's gRPC
    router forwards there); "" when the host's `[server] grpc_bind` is off."""
    required: bool = True
    """The host is ready only while this model is: not `optional`, and served since the host started
    (a model added by a reload counts once nginx routes to it; until then its failure is its own)."""
    starts: int = 0
    """How many times its pool's master was started (1 at first; more after a restart)."""
    budget: float = 0.0
    workers: int = 0
    threads: int = 0
    priority: str = ""
    nice: int = 0
    """Each worker's nice value (budgets held by nice values; 0 with a cgroup)."""


@dataclass(frozen=True)
class Reading:
    """The host's last reading of its settings file (at start or a HUP): applied, or refused and why."""

    applied: bool = True
    time: float = 0.0
    """When (Unix seconds)."""
    reason: str = ""
    """Why it was refused ("" when applied): the running models keep the settings they had."""


@dataclass(frozen=True)
class HostState:
    models: tuple[HostModel, ...] = field(default_factory=tuple)
    reading: Reading = field(default_factory=Reading)
    graceful_timeout: float = 30.0
    """The host's `[server] graceful_timeout` as of its last reading (the janitor's bound, host/program.py)."""

    def model(self, name: str) -> HostModel | None:
        return next((model for model in self.models if model.name == name), None)


def write_json(path: Path, document: object) -> None:
    """Replace `path` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(document, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(partial, path)


def write_host(folder: Path, models: Sequence[HostModel], reading: Reading, graceful_timeout: float) -> None:
    write_json(
        folder / HOST_FILE,
        {
            "models": [asdict(model) for model in models],
            "reading": asdict(reading),
            "graceful_timeout": graceful_timeout,
        },
    )


def read_host(folder: Path) -> HostState:
    """The host's models (none while the host has not written them yet)."""
    try:
        document = json.loads((folder / HOST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return HostState()
    return HostState(
        tuple(HostModel(**{**item, "aliases": tuple(item.get("aliases", ()))}) for item in document.get("models", [])),
        Reading(**document.get("reading", {})),
        float(document.get("graceful_timeout", HostState.graceful_timeout)),
    )


@dataclass(frozen=True)
class PoolDescription:
    """What a pool's master says of its model at each config load."""

    routes: tuple[str, ...]
    """The task's POST routes (`/predict`, `/v2/models/<model>/classify`...)."""
    openapi: dict[str, Any]
    """The pool's own OpenAPI document (server/openapi.py), for the host's /openapi.json."""
    lanes: int = 0
    """Callers' lanes its master bound at start beside its socket (workers/lanes.py): `<name>.<k>.sock`."""


def write_pool_description(
    folder: Path, name: str, routes: Sequence[str], openapi: dict[str, Any], lanes: int = 0
) -> None:
    write_json(folder / POOLS_DIR / f"{name}.json", {"routes": list(routes), "openapi": openapi, "lanes": lanes})


def read_pool_description(folder: Path, name: str) -> PoolDescription | None:
    """What `name`'s pool said, once its master has loaded its model (None before)."""
    try:
        document = json.loads((folder / POOLS_DIR / f"{name}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return PoolDescription(
        tuple(document.get("routes", ())), dict(document.get("openapi", {})), int(document.get("lanes", 0))
    )


def description_stamp(folder: Path, name: str) -> int:
    """When `name`'s pool last wrote its description (0: not yet): a new one means new routes."""
    try:
        return (folder / POOLS_DIR / f"{name}.json").stat().st_mtime_ns
    except OSError:
        return 0


def pool_routes(folder: Path, name: str) -> tuple[int, tuple[str, ...], int]:
    """The stamp of `name`'s pool description, the task routes it names and the callers' lanes it bound
    (none before it is written)."""
    stamp = description_stamp(folder, name)
    description = read_pool_description(folder, name)
    return (stamp, description.routes, description.lanes) if description is not None else (stamp, (), 0)


def pool_error_file(folder: Path, name: str) -> Path:
    return folder / POOLS_DIR / f"{name}.error"


def read_pool_error(folder: Path, name: str) -> str:
    """The last error line the pool wrote before it exited ("" if none)."""
    try:
        return pool_error_file(folder, name).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def pool_reloads_file(folder: Path, name: str) -> Path:
    return folder / POOLS_DIR / f"{name}.reloads"


def write_pool_reloads(folder: Path, name: str, reloads: int) -> None:
    """The pool's master has ended its `reloads`-th HUP: new workers warm and the old ones gone (or the
    file refused, or nothing in it changed this pool): what its workers answer is now the file's."""
    write_json(pool_reloads_file(folder, name), {"reloads": reloads})


def read_pool_reloads(folder: Path, name: str) -> int:
    """How many HUPs `name`'s pool master has ended (0: none, or not written yet)."""
    try:
        return int(json.loads(pool_reloads_file(folder, name).read_text(encoding="utf-8"))["reloads"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def pool_socket(folder: Path, name: str) -> str:
    return f"unix:{folder / POOLS_DIR / name}.sock"


def metrics_folders(folder: Path) -> dict[str, Path]:
    """Each pool's metrics folder, by model name."""
    root = folder / METRICS_DIR
    if not root.is_dir():
        return {}
    return {path.name: path for path in sorted(root.iterdir()) if path.is_dir()}
