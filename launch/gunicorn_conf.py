"""gunicorn configuration for onnxpool: settings -> gunicorn, and one-line hooks.

`onnxpool serve` runs `gunicorn -c <this file>`; gunicorn executes the file
afresh at start and on every HUP, so each HUP re-reads and re-validates the
settings and the model (`hooks.configure`). The settings file is
$ONNXPOOL_CONFIG or the packaged default (config/onnxpool.toml in a checkout).
"""

from typing import Any

from onnxpool import hooks, logs

_serving = hooks.configure()  # validates settings + model + app; exits with one line on error
_server = _serving.settings.server

wsgi_app = "onnxpool.wsgi:app"
preload_app = True  # master imports the app once (no onnxruntime session in it)
bind = _serving.binds
workers = _serving.layout.workers
worker_class = _serving.worker_class
threads = _server.http_threads if _server.worker_class == "gthread" else 1  # LaneWorker is sync
timeout = _server.timeout
graceful_timeout = _server.graceful_timeout
keepalive = _server.keepalive
max_requests = _server.max_requests
max_requests_jitter = _server.max_requests_jitter
backlog = _server.backlog
pidfile = _server.pidfile or None
worker_tmp_dir = str(_serving.pool.run.heartbeat)  # every file the server writes stays in its run folder
control_socket_disable = not _server.control_socket
if _server.control_socket:
    control_socket = _server.control_socket
proc_name = f"onnxpool[{_serving.settings.model.name}]"
logconfig_dict = logs.logconfig_dict(_serving.settings.logging)
loglevel = _serving.settings.logging.level
access_log_format = logs.ACCESS_FORMAT + (logs.ACCESS_CALLER if _serving.callers.enabled else "")
logger_class = f"{logs.__name__}.GunicornLogger"


def on_starting(server: Any) -> None:
    hooks.on_starting(server)


def pre_fork(server: Any, worker: Any) -> None:
    hooks.pre_fork(server, worker)


def post_fork(server: Any, worker: Any) -> None:
    hooks.post_fork(server, worker)


def post_worker_init(worker: Any) -> None:
    hooks.post_worker_init(worker)


def pre_request(worker: Any, req: Any) -> None:
    hooks.pre_request(worker, req)


def post_request(worker: Any, req: Any, environ: Any, resp: Any) -> None:
    hooks.post_request(req, resp)


def child_exit(server: Any, worker: Any) -> None:
    hooks.child_exit(server, worker)


def worker_exit(server: Any, worker: Any) -> None:
    hooks.worker_exit(server, worker)


def nworkers_changed(server: Any, new_value: int, old_value: int | None) -> None:
    hooks.nworkers_changed(server, new_value, old_value)


def on_exit(server: Any) -> None:
    hooks.on_exit(server)
