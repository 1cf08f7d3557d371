"""The WSGI entry point gunicorn loads (`onnxpool.wsgi:app`).

Imported once in the gunicorn master (preload_app) after `hooks.configure()`
validated the first generation. `app` forwards each request to the Flask app of
the generation the worker was forked in (see `onnxpool.hooks.GenerationApp`),
so a HUP applies every setting, not only the model.
"""

from onnxpool.hooks import WSGI_APP

app = WSGI_APP
