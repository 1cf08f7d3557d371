"""HTTP side of onnxpool: the Flask app, routes, protocol codecs, errors, CLI."""

__version__ = "0.1.0"
