"""Baselines onnxpool is compared with (not onnxpool's code; see docs/BENCHMARKS.md)."""
