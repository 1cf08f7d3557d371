"""The WSGI entry point gunicorn loads (`server.wsgi:app`).

Imported once in the gunicorn master (preload_app): it builds the Flask app
around the process's runtime, which stays empty there and is filled with a
session in each worker after fork (see workers.hooks.post_fork).
"""

from config.loader import load_settings
from server.app import create_app
from workers.session import RUNTIME

app = create_app(load_settings().settings, RUNTIME)
