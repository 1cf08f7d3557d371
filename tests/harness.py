"""Start and stop REAL onnxpool servers (gunicorn) for tests.

The code lives in `bench.servers` (`onnxpool tune` starts servers the same way);
this module keeps the names the tests import.
"""

from __future__ import annotations

from bench.servers import (
    DATA,
    DEMO_MODEL,
    MODEL_NAME,
    REPO,
    Server,
    children_of,
    clean_env,
    free_port,
    parse_cpu_list,
    proc_status,
    running_server,
    spawn_logged,
    start_server,
)

__all__ = [
    "DATA",
    "DEMO_MODEL",
    "MODEL_NAME",
    "REPO",
    "Server",
    "children_of",
    "clean_env",
    "free_port",
    "parse_cpu_list",
    "proc_status",
    "running_server",
    "spawn_logged",
    "start_server",
]
