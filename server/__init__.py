"""The HTTP layer: the Flask app, v2 + image routes, codecs, imaging, metrics, errors.

Knows HTTP and codecs, not gunicorn and not processes (docs/ARCHITECTURE.md).
"""
