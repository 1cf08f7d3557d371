"""`onnxpool tune --write`: only [server] workers/threads_per_worker change; comments survive."""

from __future__ import annotations

import tomllib

import pytest

from onnxpool.config.settings import Settings
from onnxpool.measure.tomledit import NOTE_PREFIX, set_server_layout
from tests.harness import REPO

SAMPLE = """\
# top comment
[server]
bind = "127.0.0.1:8000"  # where
# Worker processes.
workers = "auto"   # trailing comment kept
threads_per_worker = "auto"

[model.preprocess]
workers = "not this one"

[other]
threads_per_worker = 7
"""


def test_sets_only_server_values_and_keeps_comments() -> None:
    out = set_server_layout(SAMPLE, 2, 1, "measured today")
    data = tomllib.loads(out)
    assert data["server"]["workers"] == 2
    assert data["server"]["threads_per_worker"] == 1
    assert data["model"]["preprocess"]["workers"] == "not this one"
    assert data["other"]["threads_per_worker"] == 7
    assert "workers = 2   # trailing comment kept" in out
    assert "# Worker processes." in out and "# top comment" in out and 'bind = "127.0.0.1:8000"  # where' in out
    assert out.count(NOTE_PREFIX) == 1
    lines = out.splitlines()
    assert lines[lines.index("workers = 2   # trailing comment kept") - 1] == f"{NOTE_PREFIX}: measured today"
    # only the two value lines changed and one note line was added
    assert len(lines) == len(SAMPLE.splitlines()) + 1


def test_second_run_replaces_the_note() -> None:
    once = set_server_layout(SAMPLE, 2, 1, "first")
    twice = set_server_layout(once, 1, 2, "second")
    assert twice.count(NOTE_PREFIX) == 1 and "second" in twice and "first" not in twice
    assert tomllib.loads(twice)["server"] == {"bind": "127.0.0.1:8000", "workers": 1, "threads_per_worker": 2}


def test_missing_keys_and_section_are_added() -> None:
    out = set_server_layout('[model]\nname = "m"\n', 4, 2, "n")
    assert tomllib.loads(out) == {"model": {"name": "m"}, "server": {"workers": 4, "threads_per_worker": 2}}
    out = set_server_layout('[server]\nbind = "127.0.0.1:1"\n', 3, 1, "n")
    assert tomllib.loads(out)["server"] == {"bind": "127.0.0.1:1", "workers": 3, "threads_per_worker": 1}


def test_note_must_be_one_line() -> None:
    with pytest.raises(ValueError):
        set_server_layout(SAMPLE, 1, 1, "two\nlines")


def test_shipped_config_stays_valid_and_commented() -> None:
    text = (REPO / "config" / "onnxpool.toml").read_text()
    out = set_server_layout(text, 2, 1, "2025-01-01 00:00: 2x1 measured best")
    settings = Settings.model_validate(tomllib.loads(out))
    assert (settings.server.workers, settings.server.threads_per_worker) == (2, 1)
    assert len(out.splitlines()) == len(text.splitlines()) + 1
    removed = set(text.splitlines()) - set(out.splitlines())
    assert removed == {'workers = "auto"', 'threads_per_worker = "auto"'}
