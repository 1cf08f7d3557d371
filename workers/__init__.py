"""Per-process runtime: core partition, slots, the session, gunicorn hook bodies."""
