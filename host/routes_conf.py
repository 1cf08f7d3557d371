"""gunicorn's configuration for the host's routes (host/routes.py): `gunicorn -c python:onnxpool.host.routes_conf`.

Named explicitly so that gunicorn never reads a `gunicorn.conf.py` from the working folder (the
one-model server's). One worker with a few threads: the routes read small files and answer at once.
The app is not preloaded: a HUP (the host's reload) makes a new worker, forked with the settings the
master read anew (`routes.read_settings`: a file that no longer loads keeps the last good ones).
"""

from __future__ import annotations

import os
from pathlib import Path

from onnxpool import logs
from onnxpool.config.loader import ENV_HOST_DIR
from onnxpool.host.routes import read_settings

_settings = read_settings()
_run = Path(os.environ[ENV_HOST_DIR])

wsgi_app = "onnxpool.host.routes:create_app()"
bind = [f"unix:{_run / 'routes.sock'}"]
workers = 1
worker_class = "gthread"
threads = 4
graceful_timeout = _settings.server.graceful_timeout
timeout = 30
worker_tmp_dir = str(_run)
control_socket_disable = True
proc_name = "onnxpool[host routes]"
logconfig_dict = logs.logconfig_dict(_settings.logging)
loglevel = "warning"
accesslog = None
