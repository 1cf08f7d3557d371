"""Set `[server] workers` and `threads_per_worker`, or each `[models.<name>] cpus`, in an existing
TOML file, keeping everything else.

A TOML library would re-emit the file; this edits exactly the value lines (and,
for the layout, one note comment) with regular expressions, so every other byte,
comments included, stays as the operator wrote it. No I/O here; `measure.tune`
and `measure.tune_models` read and write the file.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping

NOTE_PREFIX = "# onnxpool tune"
_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\s*(#.*)?$")
_KEY = r"^(?P<indent>\s*)(?P<key>{key})(?P<eq>\s*=\s*)(?P<value>[^#\n]*?)(?P<tail>\s*(#.*)?)$"


_PART = re.compile(r"""\s*("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_\-]+)\s*(\.|$)""")


def header_key(text: str) -> tuple[str, ...]:
    """The dotted key of a table header's inside (`models."a.b"` -> ("models", "a.b")); () if unreadable."""
    parts: list[str] = []
    position = 0
    while position < len(text):
        match = _PART.match(text, position)
        if match is None or match.end() == position:
            return ()
        raw = match.group(1)
        parts.append(tomllib.loads(f"k = {raw}")["k"] if raw[0] in "\"'" else raw)
        position = match.end()
    return tuple(parts)


def _section_bounds(lines: list[str], name: str | tuple[str, ...]) -> tuple[int, int] | None:
    """(index of the header line, index one past the section's last line), or None."""
    wanted = tuple(name.split(".")) if isinstance(name, str) else name
    start = None
    for i, line in enumerate(lines):
        match = _HEADER.match(line)
        if match is None or line.lstrip().startswith("[["):
            continue
        if start is not None:
            return start, i
        if header_key(match.group(1)) == wanted:
            start = i
    return (start, len(lines)) if start is not None else None


def _set_key(section: list[str], key: str, value: str) -> None:
    """`key = value` in the lines of one section: the value replaced where the key is (its indent and
    trailing comment kept), else a new line first in the section."""
    pattern = re.compile(_KEY.format(key=re.escape(key)))
    for i, line in enumerate(section):
        match = pattern.match(line)
        if match:
            section[i] = f"{match['indent']}{key}{match['eq']}{value}{match['tail']}"
            return
    section.insert(0, f"{key} = {value}")


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
        _set_key(section, key, str(value))
    first = next(i for i, line in enumerate(section) if re.match(r"^\s*(workers|threads_per_worker)\s*=", line))
    section.insert(first, f"{NOTE_PREFIX}: {note}")
    out = [*lines[: start + 1], *section, *lines[end:]]
    return "\n".join(out) + ("\n" if text.endswith("\n") or not text else "")


def set_model_cpus(text: str, cpus: Mapping[str, float]) -> str:
    """`text` with `cpus = X.XX` in each `[models.<name>]` table named in `cpus`, every other line as it was.

    A table without `cpus` gets it right after its header. ValueError (nothing changed) when a model
    has no `[models.<name>]` table of its own (an inline table cannot be edited in place) or the
    result would not read back as those values.
    """
    lines = text.splitlines()
    for name, value in cpus.items():
        bounds = _section_bounds(lines, ("models", name))
        if bounds is None:
            raise ValueError(f"no [models.{name}] table to set cpus in")
        start, end = bounds
        section = lines[start + 1 : end]
        _set_key(section, "cpus", f"{value:.2f}")
        lines[start + 1 : end] = section
    out = "\n".join(lines) + ("\n" if text.endswith("\n") or not text else "")
    try:
        models = tomllib.loads(out).get("models", {})
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"setting cpus would break the file: {exc}") from None
    for name, value in cpus.items():
        if models.get(name, {}).get("cpus") != round(value, 2):
            raise ValueError(f"[models.{name}] cpus did not read back as {value:.2f}; set it by hand")
    return out
