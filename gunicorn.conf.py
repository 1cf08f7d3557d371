"""`gunicorn -c gunicorn.conf.py` from a checkout: the same configuration `onnxpool serve` uses.

The configuration itself is package data (launch/gunicorn_conf.py, installed as onnxpool/gunicorn_conf.py, so an
installed onnxpool serves from anywhere). gunicorn executes this file afresh at
start and on every HUP; `run_path` executes the package's file afresh too, so a
HUP re-validates the settings and the model exactly as with `onnxpool serve`.
"""

import importlib.util
import runpy

_spec = importlib.util.find_spec("onnxpool.gunicorn_conf")  # finds the file without running it
assert _spec is not None and _spec.origin is not None, "onnxpool is not installed (make install)"
globals().update({k: v for k, v in runpy.run_path(_spec.origin).items() if not k.startswith("_")})
