"""Start and stop REAL onnxpool servers (gunicorn) for tests.

The code lives in `onnxpool.measure.servers` (`onnxpool tune` starts servers the same way);
this module keeps the names the tests import.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    port_with_free_lanes,
    proc_status,
    running_server,
    spawn_logged,
    start_server,
)
from onnxpool.workers.model_info import ModelInfo, TensorSpec

# The checkout the tests run from (its files: docs, deploy templates, the root gunicorn.conf.py).
REPO = Path(__file__).resolve().parents[1]
# The demo model's tensors, as the preflight reads them: what an app built in process binds its task to.
DEMO_MODEL_INFO = ModelInfo(
    inputs=(TensorSpec("input", "tensor(float)", (-1, 3, 224, 224)),),
    outputs=(TensorSpec("logits", "tensor(float)", (-1, 1000)),),
)


def start_and_collect(tmp_path: Path, settings: Mapping[str, str]) -> tuple[int | None, list[str]]:
    """Start a server that should refuse to start: its exit status and the lines it wrote."""
    server = start_server(tmp_path, settings, wait=False)
    try:
        code = server.process.wait(timeout=60)
    finally:
        server.stop()
    return code, [line for line in server.log().splitlines() if line.strip()]


__all__ = [
    "DATA",
    "DEMO_MODEL",
    "DEMO_MODEL_INFO",
    "MODEL_NAME",
    "REPO",
    "Server",
    "children_of",
    "clean_env",
    "free_port",
    "parse_cpu_list",
    "port_with_free_lanes",
    "proc_status",
    "running_server",
    "spawn_logged",
    "start_and_collect",
    "start_server",
]
