"""The one error type of `onnxpool quantize`: what the operator can fix, as one line (exit 2)."""

from __future__ import annotations


class QuantizeError(ValueError):
    """Bad input or an unmet budget: one line for the operator, non-zero exit."""
