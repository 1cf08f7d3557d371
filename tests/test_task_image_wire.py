"""Image classification as a task changed nothing on the wire: every reply equals, byte for byte,
the reply recorded from the code before the change (tests/image_replies.py, real gunicorn). Each
case is sent twice with the response cache on: computed, then replayed from the cache."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from tests.harness import running_server
from tests.image_replies import RECORDING, cases

pytestmark = pytest.mark.slow


def test_image_replies_are_byte_for_byte_as_recorded(tmp_path: Path) -> None:
    recorded = json.loads(RECORDING.read_text())
    sent = list(cases())
    assert {case.name for case in sent} == set(recorded)
    with running_server(tmp_path, {"ONNXPOOL_SERVER__WORKERS": "2"}) as server:
        for attempt in ("computed", "replayed"):
            for case in sent:
                reply = case.send(server.url)
                expected = recorded[case.name]
                got = (reply.status_code, reply.headers.get("Content-Type", ""), reply.content)
                want = (expected["status"], expected["content_type"], base64.b64decode(expected["body"]))
                assert got == want, f"{case.name} ({attempt}): {reply.content[:200]!r}"
                if attempt == "replayed" and reply.status_code == 200:
                    assert reply.headers["X-Cache"] == "HIT", case.name
