"""The host's models as its answering processes see them: host.json, re-read only when it changed.

One reader and one set of rules for both processes that answer for every model of a host: the host's
routes (host/routes.py, REST) and its gRPC router (host/grpc_router.py): which model a name or alias
is, whether the host is ready, and what an unknown model is told.
"""

from __future__ import annotations

from pathlib import Path

from onnxpool.host.state import HOST_FILE, HostModel, HostState, read_host
from onnxpool.server.model_states import READY

NOT_STARTED = "(the host has not started its models yet)"
GRPC_ROUTER = "onnxpool.host.grpc_router"
"""The gRPC router's module, which the host and the pod's front door run as a process of its own, never
import: grpc must not be loaded in a process that forks (an import-linter contract, pyproject.toml)."""


class HostView:
    """The host's files, read per request (a small JSON file; re-read only when it changed)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._stamp: tuple[int, int] | None = None
        self._state = HostState()

    def state(self) -> HostState:
        try:
            stat = (self.run_dir / HOST_FILE).stat()
            stamp = (stat.st_mtime_ns, stat.st_ino)
        except OSError:
            return HostState()
        if stamp != self._stamp:
            self._state, self._stamp = read_host(self.run_dir), stamp
        return self._state

    def models(self) -> tuple[HostModel, ...]:
        return self.state().models

    def find(self, name: str) -> HostModel | None:
        return next((model for model in self.models() if name == model.name or name in model.aliases), None)

    def unknown(self, name: str) -> str:
        """What a request naming a model the host does not serve is told (REST's 404, gRPC's NOT_FOUND)."""
        served = ", ".join(model.name for model in self.models()) or "none yet"
        return f"unknown model '{name}'; this host serves: {served}"


def not_ready(models: tuple[HostModel, ...]) -> list[str]:
    """The readiness rule (docs/DEPLOYING.md): the models the host waits for that are not READY."""
    if not models:
        return [NOT_STARTED]
    return [model.name for model in models if model.required and model.state != READY]


def unavailable(model: HostModel) -> str:
    """What a request to a model that is not serving is told (REST's 503, gRPC's UNAVAILABLE)."""
    reason = f": {model.reason}" if model.reason else ""
    return f"model {model.name} is {model.state}{reason}"
