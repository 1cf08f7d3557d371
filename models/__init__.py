"""Package data: the bundled demo model (installed as `onnxpool.models`)."""
