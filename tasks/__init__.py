"""Per-model pre- and post-processing (tasks): pure library code, no HTTP, no onnxruntime."""
