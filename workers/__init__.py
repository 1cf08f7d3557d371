"""Processes: usable cores and slots, the run folder, the pool and its generations, preflight, the session."""
