"""Files the measuring tools use by default, found through the installed package (never a checkout)."""

from __future__ import annotations

from pathlib import Path

import onnxpool
from onnxpool.config.loader import DEFAULT_CONFIG_FILE

PACKAGE = Path(onnxpool.__file__).resolve().parent
# The configuration `onnxpool serve` runs (package data).
GUNICORN_CONF = PACKAGE / "gunicorn_conf.py"
MODEL_NAME = "efficientnet-lite0"
DEMO_MODEL = DEFAULT_CONFIG_FILE.parent.parent / "models" / MODEL_NAME / "model.onnx"
# Sample photos shipped with the package (the bench's default payload).
DATA = DEMO_MODEL.parent.parent / "samples"
CAT_JPEG = DATA / "chelsea-cat.jpg"
