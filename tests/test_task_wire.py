"""The one request path and the second task contract changed nothing on the wire: every tabular,
text-embedding and text-classification reply (successes, OpenAI-shaped errors, v2 infer with
strings, API-key refusals) equals, byte for byte, the reply recorded from the code before the
change (tests/task_replies.py, real gunicorn). Each case is sent twice with the response cache on:
computed, then replayed from the cache where the request is cacheable."""

from __future__ import annotations

import base64
import json
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.task_replies import RECORDING, cases, servers

pytestmark = pytest.mark.slow


def test_task_replies_are_byte_for_byte_as_recorded(tmp_path: Path) -> None:
    recorded = json.loads(RECORDING.read_text())
    sent = list(cases())
    assert {case.name for case in sent} == set(recorded)
    (tmp_path / "iris").mkdir()
    with ExitStack() as stack:
        urls = {name: server.url for name, server in servers(stack, tmp_path, cache=True).items()}
        hits = 0
        for attempt in ("computed", "replayed"):
            for case in sent:
                reply = case.send(urls[case.server])
                expected = recorded[case.name]
                got = (reply.status_code, reply.headers.get("Content-Type", ""), reply.content)
                want = (expected["status"], expected["content_type"], base64.b64decode(expected["body"]))
                assert got == want, f"{case.name} ({attempt}): {reply.content[:300]!r}"
                if attempt == "replayed" and reply.headers.get("X-Cache") == "HIT":
                    hits += 1
    # every 200 was replayed but the one v2 infer with JSON tensors (never cached: keying it would parse it twice)
    assert hits == sum(1 for case in sent if recorded[case.name]["status"] == 200) - 1
