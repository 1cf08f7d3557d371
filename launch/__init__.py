"""onnxpool: a production server for ONNX models on CPUs.

One import name over the project's folders (setup.cfg `package_dir`): this
folder (launch/) is `onnxpool` itself (the `onnxpool` command, the gunicorn
configuration and hooks); `onnxpool.config` is config/, `onnxpool.workers`
workers/, `onnxpool.server` server/, `onnxpool.tasks` tasks/, `onnxpool.cache`
cache/, `onnxpool.measure` measure/, `onnxpool.quantize` quantize/,
`onnxpool.models` models/. The layers and the process rules are in
docs/ARCHITECTURE.md.
"""

__version__ = "0.2.0"
