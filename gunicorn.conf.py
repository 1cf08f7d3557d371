"""gunicorn configuration for onnxpool: settings -> gunicorn, and one-line hooks.

`gunicorn -c gunicorn.conf.py` from the repo root serves config/onnxpool.toml
(or $ONNXPOOL_CONFIG); every value comes from the validated settings.
"""

from workers import hooks

_pool = hooks.configure()  # validates settings + model; exits with one line on error
_server = _pool.settings.server

wsgi_app = "server.wsgi:app"
preload_app = True  # master imports the app once (no onnxruntime session in it)
bind = [_server.bind]
workers = _pool.layout.workers
worker_class = _server.worker_class
threads = _server.http_threads if _server.worker_class == "gthread" else 1
timeout = _server.timeout
graceful_timeout = _server.graceful_timeout
keepalive = _server.keepalive
max_requests = _server.max_requests
max_requests_jitter = _server.max_requests_jitter
backlog = _server.backlog
pidfile = _server.pidfile or None
control_socket_disable = not _server.control_socket
if _server.control_socket:
    control_socket = _server.control_socket
proc_name = f"onnxpool[{_pool.settings.model.name}]"
logconfig_dict = _pool.logconfig
loglevel = _pool.settings.logging.level
access_log_format = hooks.ACCESS_FORMAT


def on_starting(server):
    hooks.on_starting(server)


def pre_fork(server, worker):
    hooks.pre_fork(server, worker)


def post_fork(server, worker):
    hooks.post_fork(server, worker)


def child_exit(server, worker):
    hooks.child_exit(server, worker)


def worker_exit(server, worker):
    hooks.worker_exit(server, worker)


def nworkers_changed(server, new_value, old_value):
    hooks.nworkers_changed(server, new_value, old_value)


def on_exit(server):
    hooks.on_exit(server)
