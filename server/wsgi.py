"""The WSGI entry point gunicorn loads (`server.wsgi:app`).

Imported once in the gunicorn master (preload_app): it builds the Flask app
around the process's runtime, which stays empty there and is filled with a
session in each worker after fork (see workers.hooks.post_fork).
"""

import sys

from config.loader import load_settings
from server.app import create_app
from server.auth import AuthConfigError
from workers.session import RUNTIME

try:
    app = create_app(load_settings().settings, RUNTIME)
except AuthConfigError as exc:  # e.g. a missing keys file: one line, non-zero exit, no worker forked
    print(f"onnxpool: error: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(1) from None
