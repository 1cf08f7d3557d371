"""What a host serving several models tells its pools, and they tell it: small JSON files in its run folder.

    <host run folder>/
        host.json          the host's models: name, version, aliases, address, state (written by the host)
        pools/<name>.json  one pool's task routes (written by that pool's master at each config load)
        pools/<name>.sock  the pool's socket (unless [models.<name>] bind names an address)
        metrics/<name>/    the pool's prometheus_client files (one /metrics sums every pool's)
        nginx/             the front door's configuration, pid and temp files

Files are replaced atomically (written beside, then renamed), so a reader never sees half of
one. The pools read host.json per request on the host's routes (GET /v2/models, the repository
index, /v2/health/ready, /metrics): those are rare, and a reload never has to tell a pool.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

HOST_FILE = "host.json"
POOLS_DIR = "pools"
METRICS_DIR = "metrics"
NGINX_DIR = "nginx"


@dataclass(frozen=True)
class HostModel:
    """One model of the host, as the repository index shows it."""

    name: str
    version: str
    aliases: tuple[str, ...]
    address: str
    state: str
    """READY (its pool serves), UNAVAILABLE (left out: `reason` says why)."""
    reason: str = ""
    budget: float = 0.0
    workers: int = 0
    threads: int = 0
    priority: str = ""
    nice: int = 0
    """Each worker's nice value (budgets held by nice values; 0 with a cgroup)."""


@dataclass(frozen=True)
class HostState:
    models: tuple[HostModel, ...] = field(default_factory=tuple)

    def model(self, name: str) -> HostModel | None:
        return next((model for model in self.models if model.name == name), None)


def write_json(path: Path, document: object) -> None:
    """Replace `path` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(document, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(partial, path)


def write_host(folder: Path, models: Sequence[HostModel]) -> None:
    write_json(folder / HOST_FILE, {"models": [asdict(model) for model in models]})


def read_host(folder: Path) -> HostState:
    """The host's models (none while the host has not written them yet)."""
    try:
        document = json.loads((folder / HOST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return HostState()
    return HostState(
        tuple(HostModel(**{**item, "aliases": tuple(item.get("aliases", ()))}) for item in document.get("models", []))
    )


def write_pool_routes(folder: Path, name: str, routes: Sequence[str]) -> None:
    write_json(folder / POOLS_DIR / f"{name}.json", {"routes": list(routes)})


def read_pool_routes(folder: Path, name: str) -> tuple[str, ...] | None:
    """The routes of `name`'s task, once its master has loaded it (None before)."""
    try:
        document = json.loads((folder / POOLS_DIR / f"{name}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return tuple(document.get("routes", ()))


def pool_socket(folder: Path, name: str) -> str:
    return f"unix:{folder / POOLS_DIR / name}.sock"


def metrics_folders(folder: Path) -> dict[str, Path]:
    """Each pool's metrics folder, by model name."""
    root = folder / METRICS_DIR
    if not root.is_dir():
        return {}
    return {path.name: path for path in sorted(root.iterdir()) if path.is_dir()}
