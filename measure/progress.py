"""A one-line progress display on stderr, for every long-running bench command.

On a terminal the line is rewritten in place; otherwise (CI logs, pipes) each
update is its own line, at most one per `log_interval` seconds and never the same line twice
in a row, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """`progress.status("...")` to update, `progress.done("...")` to end with a kept line."""

    def __init__(
        self, stream: TextIO | None = None, interval: float = 1.0, enabled: bool = True, log_interval: float = 5.0
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self._tty = self.stream.isatty()
        self.interval = interval if self._tty else max(interval, log_interval)
        self.enabled = enabled
        self._last = 0.0
        self._width = 0
        self._shown = ""

    def status(self, text: str, force: bool = False) -> None:
        """Show `text` as the current status (rate-limited unless `force`)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and (now - self._last < self.interval or (not self._tty and text == self._shown)):
            return
        self._last, self._shown = now, text
        if self._tty:
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self, text: str) -> None:
        """Finish the current status with a line that stays on screen."""
        if not self.enabled:
            return
        if self._tty:
            self.stream.write("\r" + text.ljust(self._width) + "\n")
            self._width = 0
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._last, self._shown = 0.0, ""


def bar(fraction: float, width: int = 24) -> str:
    """`[#########...............]  37%` for a fraction in 0..1."""
    fraction = min(1.0, max(0.0, fraction))
    filled = round(fraction * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {fraction * 100:3.0f}%"
