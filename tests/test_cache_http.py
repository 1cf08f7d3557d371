"""The response cache in real servers: across workers, across hosts (Redis), across a HUP, under Redis failure."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import requests

from onnxpool.measure.repeats import jpeg_variant
from onnxpool.server.operations import with_v2_id
from onnxpool.server.reply import Reply
from onnxpool.server.v2codec import BINARY_HEADER, encode_infer_response
from tests.harness import DATA, MODEL_NAME, Server, running_server
from tests.redis_harness import RedisServer
from tests.test_reload import hup_and_wait
from tests.tiny_models import build_tiny_model
from tests.v2client import binary_infer, parse_binary_reply

CAT = (DATA / "chelsea-cat.jpg").read_bytes()


def predict(server: Server, image: bytes = CAT, headers: dict[str, str] | None = None) -> requests.Response:
    reply = requests.post(
        server.url + "/predict?top_k=3",
        files={"image": ("cat.jpg", image, "image/jpeg")},
        headers={"X-Request-ID": uuid.uuid4().hex, **(headers or {})},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    return reply


def _raw_image_post(server: Server, image: bytes, extra: list[tuple[str, str]]) -> str:
    """POST the image as a raw body to /predict?top_k=3 with header lines sent as given (repeats
    allowed, which requests cannot do); the reply's X-Cache."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.putrequest("POST", "/predict?top_k=3")
        for name, value in [("Content-Type", "image/jpeg"), ("Content-Length", str(len(image))), *extra]:
            conn.putheader(name, value)
        conn.endheaders(image)
        reply = conn.getresponse()
        reply.read()
        assert reply.status == 200
        return reply.headers["X-Cache"]
    finally:
        conn.close()


class HeldRequest:
    """A raw POST /predict whose body is held back after its first bytes: the worker that accepted it waits
    for the rest, and takes no other connection until `finish`."""

    def __init__(self, server: Server, image: bytes) -> None:
        self.server, self.rest = server, image[1000:]
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        self.conn.putrequest("POST", "/predict?top_k=3")
        for name, value in (("Content-Type", "image/jpeg"), ("Content-Length", str(len(image)))):
            self.conn.putheader(name, value)
        self.conn.endheaders(image[:1000])

    def worker(self, timeout: float = 30.0) -> int:
        """The worker that accepted the connection: the one whose open files hold its server-side socket."""
        assert self.conn.sock is not None
        client_port = self.conn.sock.getsockname()[1]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            inode = server_socket_inode(self.server.port, client_port)
            for pid in self.server.workers() if inode else ():
                with contextlib.suppress(OSError):
                    if any(os.readlink(fd) == f"socket:[{inode}]" for fd in Path(f"/proc/{pid}/fd").iterdir()):
                        return pid
            time.sleep(0.01)
        raise AssertionError("no worker accepted the held request")

    def finish(self) -> None:
        self.conn.send(self.rest)
        reply = self.conn.getresponse()
        reply.read()
        self.conn.close()
        assert reply.status == 200


def server_socket_inode(server_port: int, client_port: int) -> str:
    """The inode of the server's end of a loopback connection (/proc/net/tcp; "0" until accepted)."""
    wanted = (f"{server_port:04X}", f"{client_port:04X}")
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (fields[1].rpartition(":")[2], fields[2].rpartition(":")[2]) == wanted:
            return fields[9]
    return ""


def worker_of(server: Server, reply: requests.Response) -> int:
    """The pid that served a reply: its access line ends with the reply's request id."""
    rid = reply.headers["X-Request-ID"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in server.log().splitlines():
            if f"rid={rid}" in line and '"POST ' in line:
                match = re.search(r"\[(\d+)\]", line)
                assert match is not None, line
                return int(match.group(1))
        time.sleep(0.05)
    raise AssertionError(f"no access line for {rid}")


def cache_events(server: Server, event: str, backend: str = "local") -> float:
    text = requests.get(server.url + "/metrics", timeout=10).text
    pattern = rf'^onnxpool_cache_events_total{{backend="{backend}",event="{event}"}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_local_hit_on_another_worker_is_byte_identical_and_obeys_cache_control(tmp_path: Path) -> None:
    with running_server(tmp_path, {"ONNXPOOL_SERVER__WORKERS": "2"}, workers=2) as srv:
        first = predict(srv)
        assert first.headers["X-Cache"] == "MISS"
        assert ";desc=miss" in first.headers["Server-Timing"]
        computed_on = worker_of(srv, first)

        # Hold the computing worker with a request whose body has not all come (a sync worker serves one
        # connection at a time): the next copy of the cat can only go to the other worker.
        held = HeldRequest(srv, jpeg_variant(CAT, "held"))
        if held.worker() != computed_on:  # the other one took it: hold the computing one too, free the other
            second = HeldRequest(srv, jpeg_variant(CAT, "held too"))
            assert second.worker() == computed_on
            held.finish()
            held = second
        other = predict(srv)
        held.finish()
        assert other.headers["X-Cache"] == "HIT"
        assert worker_of(srv, other) != computed_on
        assert other.content == first.content  # byte for byte
        assert other.headers["Content-Type"] == first.headers["Content-Type"]
        assert other.headers["X-Request-ID"] != first.headers["X-Request-ID"]  # fresh per request
        assert ";desc=hit" in other.headers["Server-Timing"]

        # no-cache computes again (and refreshes); no-store neither reads nor writes.
        assert predict(srv, headers={"Cache-Control": "no-cache"}).headers["X-Cache"] == "MISS"
        assert predict(srv, headers={"Pragma": "no-cache"}).headers["X-Cache"] == "MISS"
        fresh = jpeg_variant(CAT, "never stored")
        assert predict(srv, fresh, {"Cache-Control": "no-store"}).headers["X-Cache"] == "MISS"
        assert predict(srv, fresh).headers["X-Cache"] == "MISS"  # the no-store reply was not stored
        assert predict(srv, fresh).headers["X-Cache"] == "HIT"
        # the directive in a second Cache-Control line counts too (the server joins the lines)
        assert _raw_image_post(srv, fresh, [("Cache-Control", "max-age=60")]) == "HIT"  # raw body: same key
        assert _raw_image_post(srv, fresh, [("Cache-Control", "max-age=60"), ("Cache-Control", "no-cache")]) == "MISS"
        # other parameters are another key; an error is never stored
        other_k = requests.post(srv.url + "/predict?top_k=4", files={"image": ("c.jpg", CAT)}, timeout=30)
        assert other_k.headers["X-Cache"] == "MISS"
        for _ in range(2):
            bad = requests.post(srv.url + "/predict", files={"image": ("x.jpg", b"not an image")}, timeout=30)
            assert bad.status_code >= 400 and "X-Cache" not in bad.headers
        assert cache_events(srv, "hit") >= 2 and cache_events(srv, "store") >= 3
        assert 'onnxpool_cache_bytes{backend="local"}' in requests.get(srv.url + "/metrics", timeout=10).text


def test_hup_to_another_model_never_serves_the_old_answer(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    build_tiny_model(model, bias=0.0)
    x = np.full((1, 3, 224, 224), 0.5, dtype=np.float32)
    call = binary_infer(MODEL_NAME, x)

    def infer(request_id: str) -> requests.Response:
        header = call.body[: int(call.headers[BINARY_HEADER])]
        body = header[:-1] + f', "id": "{request_id}"}}'.encode() + call.body[len(header) :]
        headers = {**call.headers, BINARY_HEADER: str(len(header) + len(body) - len(call.body))}
        reply = requests.post(srv.url + call.path, data=body, headers=headers, timeout=30)
        assert reply.status_code == 200, reply.text
        return reply

    settings = {"ONNXPOOL_MODEL__PATH": str(model), "ONNXPOOL_SERVER__WORKERS": "2"}
    with running_server(tmp_path, settings, workers=2) as srv:
        first, again = infer("a"), infer("b")
        assert (first.headers["X-Cache"], again.headers["X-Cache"]) == ("MISS", "HIT")
        # the echoed id is the caller's own on a hit; otherwise the bytes are the same
        assert b'"id":"a"' in first.content and b'"id":"b"' in again.content
        assert again.content == first.content.replace(b'"id":"a"', b'"id":"b"')
        base = float(parse_binary_reply(again, call.output)[0, 0])

        os.replace(build_tiny_model(tmp_path / "next.onnx", bias=1.0), model)
        hup_and_wait(srv, 2)
        after = infer("c")
        assert after.headers["X-Cache"] == "MISS"
        assert abs(float(parse_binary_reply(after, call.output)[0, 0]) - (base + 1.0)) < 1e-4
        assert infer("d").headers["X-Cache"] == "HIT"


def test_inserted_v2_id_gives_the_encoders_bytes() -> None:
    outputs: dict[str, np.ndarray] = {
        "logits": np.arange(6, dtype=np.float32).reshape(2, 3),
        "extra": np.ones(2, np.int64),
    }
    for binary in (set(), {"logits"}, {"logits", "extra"}):
        want = encode_infer_response("m", "1", 'id "quoted" é', outputs, binary)
        bare = encode_infer_response("m", "1", None, outputs, binary)
        reply = with_v2_id(Reply(200, list(bare.headers.items()), bare.body), 'id "quoted" é')
        assert reply.body == want.body
        assert reply.header(BINARY_HEADER) == (str(want.header_length) if want.header_length else None)


def redis_settings(redis: RedisServer, **extra: str) -> dict[str, str]:
    return {"ONNXPOOL_SERVER__WORKERS": "1", "ONNXPOOL_CACHE__URL": redis.url, **extra}


@pytest.mark.slow
def test_redis_hit_on_another_host(tmp_path: Path, redis_server: RedisServer) -> None:
    with (
        running_server(tmp_path, redis_settings(redis_server), workers=1, name="host-a") as host_a,
        running_server(tmp_path, redis_settings(redis_server), workers=1, name="host-b") as host_b,
    ):
        computed = predict(host_a)
        assert computed.headers["X-Cache"] == "MISS"
        served = predict(host_b)
        assert served.headers["X-Cache"] == "HIT"
        assert served.content == computed.content
        assert cache_events(host_b, "hit", "redis") == 1


@pytest.mark.slow
def test_redis_killed_mid_load_loses_no_request_and_comes_back(tmp_path: Path, redis_server: RedisServer) -> None:
    settings = redis_settings(redis_server, ONNXPOOL_CACHE__REDIS_COOLDOWN_SECONDS="0.5")
    with running_server(tmp_path, {**settings, "ONNXPOOL_SERVER__WORKERS": "2"}, workers=2) as srv:
        images = [jpeg_variant(CAT, f"load {i}") for i in range(4)]
        failures: list[str] = []
        done = [0]
        stop = threading.Event()

        def load(n: int) -> None:
            while not stop.is_set():
                try:
                    reply = requests.post(srv.url + "/predict", files={"image": ("c.jpg", images[n % 4])}, timeout=30)
                    if reply.status_code != 200:
                        failures.append(f"{reply.status_code} {reply.text[:100]}")
                except requests.RequestException as exc:
                    failures.append(repr(exc))
                done[0] += 1
                n += 1

        threads = [threading.Thread(target=load, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(1.0)
            redis_server.kill()
            before = done[0]
            time.sleep(2.0)
            assert done[0] - before > 10  # still serving, computing every reply
            redis_server.start()  # same port, empty
            time.sleep(1.5)  # past the cooldown: each worker probes Redis again
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert failures == []
        assert cache_events(srv, "error", "redis") >= 1
        assert "response cache (redis) is back" in srv.log()
        again = requests.post(srv.url + "/predict", files={"image": ("c.jpg", images[0])}, timeout=30)
        assert again.headers["X-Cache"] == "HIT"  # stored again since Redis came back


def test_the_cli_does_not_load_prometheus_client() -> None:
    """server.context imports the cache glue; that must not load prometheus_client before the master chose its mode."""
    code = "import sys, onnxpool.cli; assert 'prometheus_client' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
