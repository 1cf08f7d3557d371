"""Files of the source tree the bench tools use by default (onnxpool is installed from its tree)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GUNICORN_CONF = REPO / "gunicorn.conf.py"
MODEL_NAME = "efficientnet-lite0"
DEMO_MODEL = REPO / "models" / "efficientnet-lite0" / "model.onnx"
DATA = REPO / "tests" / "data"
CAT_JPEG = DATA / "chelsea-cat.jpg"
