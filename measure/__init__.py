"""Measure onnxpool: a closed-loop HTTP load generator, the in-process limit, and the layout tuner.

`onnxpool bench|limit|tune` are thin CLI functions in `onnxpool.cli` that call into
this package. Nothing here is imported by the serving path.
"""
