"""Tasks: a model's pre- and post-processing (the API in api.py, built-in tasks by name in registry.py)."""
