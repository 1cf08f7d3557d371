"""The three embedding servers benchmarks/text.py compares, started and stopped here, and their memory.

Each runs in its own process group on a free loopback port (`onnxpool.measure.servers`),
so stopping one kills exactly what it started. Memory is the RSS (and PSS) summed over
the whole process tree under the started process: gunicorn's master and workers,
uvicorn's supervisor and workers, infinity's process and whatever it forks.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks import REPO, infinity
from onnxpool.measure.servers import Server, children_of, free_port, start_command
from onnxpool.workers.memory import read_memory

MODEL_NAME = "all-minilm-l6-v2"
EMBEDDINGS = "/v1/embeddings"


def onnxpool_server(log_dir: Path, startup: float) -> Server:
    """`onnxpool serve --config minilm`, its default worker layout, response cache off.

    The cache is off because the benchmark repeats its payloads (a cache would answer from
    memory). Everything else is the shipped config/minilm.toml.
    """
    port = free_port()
    argv = [str(Path(sys.executable).with_name("onnxpool")), "serve", "--config", "minilm"]
    argv += ["--bind", f"127.0.0.1:{port}"]
    env = {"ONNXPOOL_CACHE__ENABLED": "false", "PYTHONUNBUFFERED": "1"}
    return start_command(argv, log_dir, port, "/v2/health/ready", env=env, name="onnxpool", timeout=startup, cwd=REPO)


def fastapi_server(log_dir: Path, startup: float, workers: int = 2) -> Server:
    """(a) FastAPI + sentence-transformers, `uvicorn --workers 2`, in its best settings.

    One torch thread per worker (the default, one per core in each worker, oversubscribes
    the cores), and uvicorn started through benchmarks/baselines/uvicorn_nodelay.py so its
    replies are not held back by Nagle's algorithm (uvicorn issue #3149).
    """
    port = free_port()
    argv = [sys.executable, "-m", "benchmarks.baselines.uvicorn_nodelay", "benchmarks.baselines.st_fastapi:app"]
    argv += ["--workers", str(workers), "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    env = {"HF_HUB_OFFLINE": "1", "ST_TORCH_THREADS": "1"}
    return start_command(argv, log_dir, port, "/health", env=env, name="fastapi-st", timeout=startup, cwd=REPO)


def infinity_server(log_dir: Path, startup: float) -> Server:
    """(b) infinity-emb on the same ONNX model (benchmarks/infinity.py sets it up)."""
    missing = infinity.ready()
    if missing:
        raise RuntimeError(f"infinity-emb is not set up: {missing}")
    port = free_port()
    server = start_command(
        infinity.server_argv(port),
        log_dir,
        port,
        "/health",
        env=infinity.server_env(),
        name="infinity",
        timeout=startup,
        cwd=infinity.MODEL_DIR,
    )
    if "Optimization failed" in server.log():
        # it would serve the unoptimised graph: not infinity's recommended setup
        server.stop()
        raise RuntimeError(f"infinity did not find its optimised graph ({server.log_path}): run the setup again")
    return server


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants (from /proc; ones that vanish meanwhile are skipped)."""
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue.extend(children_of(pid))
    return found


def tree_memory(root: int) -> tuple[int, int]:
    """(RSS, PSS) in bytes, summed over the process tree under `root`.

    RSS counts pages a pre-fork master shares with its workers once per process (what the
    issue asks for, and what a container's limit is closest to when nothing is shared);
    PSS splits shared pages between their sharers, so it adds up to the tree's real use.
    """
    rss = pss = 0
    for pid in process_tree(root):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, PermissionError):
            memory = read_memory(pid)
            rss, pss = rss + memory.rss, pss + memory.pss
    return rss, pss


@dataclass
class MemoryPeak:
    rss: int = 0
    pss: int = 0


@contextlib.contextmanager
def sampled(sample: Callable[[], None], interval: float = 0.25) -> Iterator[None]:
    """Calls `sample` at once and then every `interval` s, in a thread, while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while True:
            sample()
            if stop.wait(interval):
                return

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def sampling_memory(root: int, interval: float = 0.25) -> Iterator[MemoryPeak]:
    """Samples the tree's memory every `interval` s while the block runs; the peak is in the yielded object."""
    peak = MemoryPeak()

    def sample() -> None:
        rss, pss = tree_memory(root)
        peak.rss, peak.pss = max(peak.rss, rss), max(peak.pss, pss)

    with sampled(sample, interval):
        yield peak
