"""Set `[server] workers` and `threads_per_worker` in an existing TOML file, keeping everything else.

A TOML library would re-emit the file; this edits exactly two value lines (and
one note comment) with regular expressions, so every other byte, comments
included, stays as the operator wrote it. No I/O here; `bench.tune` reads and
writes the file.
"""

from __future__ import annotations

import re

NOTE_PREFIX = "# onnxpool tune"
_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\s*(#.*)?$")
_KEY = r"^(?P<indent>\s*)(?P<key>{key})(?P<eq>\s*=\s*)(?P<value>[^#\n]*?)(?P<tail>\s*(#.*)?)$"


def _section_bounds(lines: list[str], name: str) -> tuple[int, int] | None:
    """(index of the header line, index one past the section's last line), or None."""
    start = None
    for i, line in enumerate(lines):
        match = _HEADER.match(line)
        if match is None or line.lstrip().startswith("[["):
            continue
        if start is not None:
            return start, i
        if match.group(1) == name:
            start = i
    return (start, len(lines)) if start is not None else None


def set_server_layout(text: str, workers: int, threads: int, note: str) -> str:
    """`text` with [server] workers/threads_per_worker set and `note` as a comment above them.

    An earlier tune note in [server] is replaced, not stacked. Keys missing from
    the section are added right after its header; a missing section is appended.
    """
    if "\n" in note:
        raise ValueError("the note must be one line")
    lines = text.splitlines()
    bounds = _section_bounds(lines, "server")
    if bounds is None:
        lines += ["", "[server]"]
        bounds = (len(lines) - 1, len(lines))
    start, end = bounds
    section = [line for line in lines[start + 1 : end] if not line.startswith(NOTE_PREFIX)]
    for key, value in (("workers", workers), ("threads_per_worker", threads)):
        pattern = re.compile(_KEY.format(key=re.escape(key)))
        for i, line in enumerate(section):
            match = pattern.match(line)
            if match:
                section[i] = f"{match['indent']}{key}{match['eq']}{value}{match['tail']}"
                break
        else:
            section.insert(0, f"{key} = {value}")
    first = next(i for i, line in enumerate(section) if re.match(r"^\s*(workers|threads_per_worker)\s*=", line))
    section.insert(first, f"{NOTE_PREFIX}: {note}")
    out = [*lines[: start + 1], *section, *lines[end:]]
    return "\n".join(out) + ("\n" if text.endswith("\n") or not text else "")
