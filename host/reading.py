"""What a HUP of a several-models host cannot apply: the settings only a restart changes.

A reload is applied whole or not at all (host/controller.py): a file that changes one of these is
refused with one line naming the setting, and every model keeps serving what it served. Everything
else reaches the running programs by their HUP: a pool re-reads its view of the file as a
one-model server does (graceful_timeout, limits, the keys file, its task's files...), the routes and
nginx are re-rendered.
"""

from __future__ import annotations

from onnxpool.config.loader import ConfigError
from onnxpool.config.settings import Settings

RESTART_ONLY = {
    "bind": "the front door's nginx listens on it",
    "run_dir": "every program's files and sockets are in the run folder made at start",
    "budgets": "the models' cgroups or nice values are chosen at start",
    "pidfile": "the host wrote its pid there at start",
    "grpc_bind": "the gRPC router listens on it, and each pool's gRPC port is given at its start",
}
"""`[server]` keys, and why each is read at start only."""


def restart_only_changes(running: Settings, read: Settings) -> None:
    """ConfigError naming the first setting of `read` that differs from `running` and needs a restart."""
    for key, why in RESTART_ONLY.items():
        before, after = getattr(running.server, key), getattr(read.server, key)
        if before != after:
            raise ConfigError(
                f"server.{key} changed ({before!r} -> {after!r}): a restart applies it ({why}); "
                "nothing of this file was applied"
            )
    for name, entry in read.models.items():
        kept = running.models.get(name)
        for key in ("bind", "grpc_bind"):
            before, after = getattr(kept, key, None), getattr(entry, key)
            if kept is not None and before != after:
                raise ConfigError(
                    f"models.{name}.{key} changed ({before!r} -> {after!r}): a restart applies it (its pool "
                    "listens on it from its start); nothing of this file was applied"
                )
