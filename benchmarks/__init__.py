"""Development-only benchmarks, run from a checkout (`python -m benchmarks.compare`); not installed.

They compare onnxpool with other ways of serving the model and measure what the
stack allows; `onnxpool bench|limit|tune` (onnxpool.measure) are the installed tools.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
