"""measure.progress: a CI log gets few lines, a terminal one rewritten line."""

from __future__ import annotations

import io

from onnxpool.measure.progress import Progress, bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_no_repeats_and_few_lines() -> None:
    log = io.StringIO()
    progress = Progress(log, interval=0.0, log_interval=0.0)
    for text in ("a", "a", "b", "b", "a"):
        progress.status(text)
    progress.done("finished")
    assert log.getvalue().splitlines() == ["a", "b", "a", "finished"]
    slow = io.StringIO()
    rate_limited = Progress(slow, interval=0.0)  # a log: at most one line per 5 s
    for k in range(50):
        rate_limited.status(f"step {k}")
    assert slow.getvalue().splitlines() == ["step 0"]


def test_a_terminal_line_is_rewritten_in_place() -> None:
    screen = Terminal()
    progress = Progress(screen, interval=0.0)
    progress.status("long status")
    progress.status("short")
    progress.done("ok")
    assert screen.getvalue() == "\rlong status\rshort      \rok   \n"
    assert bar(0.5, 4) == "[##..]  50%"
