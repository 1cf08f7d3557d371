"""How the one-run benchmarks hand over their results: JSON on stdout, and to a file if asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(result: dict[str, Any], path: Path | None) -> None:
    text = json.dumps(result, indent=2)
    print(text)
    if path is not None:
        path.write_text(text + "\n")
