"""Start and stop REAL onnxpool servers (gunicorn) for tests.

The code lives in `onnxpool.measure.servers` (`onnxpool tune` starts servers the same way);
this module keeps the names the tests import.
"""

from __future__ import annotations

from pathlib import Path

from onnxpool.measure.servers import (
    DATA,
    DEMO_MODEL,
    MODEL_NAME,
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

# The checkout the tests run from (its files: docs, deploy templates, the root gunicorn.conf.py).
REPO = Path(__file__).resolve().parents[1]

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
