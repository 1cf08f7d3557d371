"""Access control and resource bounds against a real gunicorn server.

One server with API keys (from the environment and from a keys file) and a
small body limit serves every test here.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import requests

from tests.harness import DATA, REPO, Server, clean_env, start_server

pytestmark = pytest.mark.slow

ENV_KEY = "env-key-0123456789abcdef"
FILE_KEY = "file-key-fedcba9876543210"
MAX_BODY = 64 * 1024
MODEL = "efficientnet-lite0"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("guarded")
    keys = tmp / "keys"
    keys.write_text(f"# operators' keys\n\n{FILE_KEY}\n")
    settings = {
        "ONNXPOOL_SERVER__WORKERS": "1",
        "ONNXPOOL_SERVER__MAX_BODY_BYTES": str(MAX_BODY),
        "ONNXPOOL_AUTH__API_KEYS": f'["{ENV_KEY}"]',
        "ONNXPOOL_AUTH__API_KEYS_FILE": str(keys),
        "ONNXPOOL_LIMITS__MAX_JSON_DEPTH": "8",
    }
    server = start_server(tmp, settings, workers=1)
    try:
        yield server
    finally:
        server.stop()


def _auth(key: str = ENV_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-key-0123456789"}, {"Authorization": f"Basic {ENV_KEY}"}, _auth(ENV_KEY + "x")],
)
def test_no_or_wrong_key_is_401_with_a_challenge(guarded: Server, headers: dict[str, str]) -> None:
    for path in ("/v2", f"/v2/models/{MODEL}", "/metrics"):
        reply = requests.get(guarded.url + path, headers=headers, timeout=10)
        assert reply.status_code == 401, path
        assert reply.headers["WWW-Authenticate"].startswith("Bearer")
        assert "error" in reply.json()


@pytest.mark.parametrize("key", [ENV_KEY, FILE_KEY])
def test_right_key_is_served(guarded: Server, key: str) -> None:
    reply = requests.get(guarded.url + f"/v2/models/{MODEL}", headers=_auth(key), timeout=10)
    assert reply.status_code == 200 and reply.json()["name"] == MODEL


def test_health_and_openapi_stay_open(guarded: Server) -> None:
    assert requests.get(guarded.url + "/v2/health/live", timeout=10).status_code == 200
    assert requests.get(guarded.url + "/v2/health/ready", timeout=10).status_code == 200
    document = requests.get(guarded.url + "/openapi.json", timeout=10).json()
    assert document["security"] == [{"bearerAuth": []}]


def test_keys_never_reach_the_log(guarded: Server) -> None:
    requests.get(guarded.url + "/v2", headers=_auth(), timeout=10)
    requests.get(guarded.url + "/v2", headers=_auth("wrong-key-0123456789"), timeout=10)
    log = guarded.log()
    assert "GET /v2 HTTP/1.1" in log
    assert ENV_KEY not in log and FILE_KEY not in log and "wrong-key" not in log


def test_config_command_masks_keys() -> None:
    env = clean_env({"ONNXPOOL_AUTH__API_KEYS": f'["{ENV_KEY}"]'})
    done = subprocess.run(
        [sys.executable, "-m", "onnxpool.cli", "config"], env=env, cwd=REPO, capture_output=True, text=True, check=True
    )
    assert "auth.api_keys" in done.stdout and ENV_KEY not in done.stdout
    env["ONNXPOOL_AUTH__API_KEYS"] = '["too short"]'
    bad = subprocess.run(
        [sys.executable, "-m", "onnxpool.cli", "config"], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert bad.returncode == 1 and "auth.api_keys" in bad.stderr and "too short" not in bad.stderr


def test_missing_keys_file_stops_the_master_with_one_line(tmp_path: Path) -> None:
    env = clean_env({"ONNXPOOL_AUTH__API_KEYS_FILE": str(tmp_path / "nope"), "ONNXPOOL_SERVER__BIND": "127.0.0.1:0"})
    done = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", str(REPO / "gunicorn.conf.py")],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "onnxpool: error: auth.api_keys_file" in done.stderr and "Traceback" not in done.stderr


def _raw_exchange(server: Server, request: bytes, body_chunks: list[bytes]) -> bytes:
    """Send a request by hand (e.g. chunked), tolerate the server closing early, return its reply."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        try:
            for chunk in body_chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered 413 and closed before reading everything: expected
        reply = b""
        try:
            while data := sock.recv(65536):
                reply += data
        except ConnectionResetError:
            pass
        return reply


def test_oversized_body_with_content_length_is_413_before_reading(guarded: Server) -> None:
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ENV_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {MAX_BODY * 100}\r\nConnection: close\r\n\r\n"
    ).encode()
    reply = _raw_exchange(guarded, head, [b"[" * 1024])  # announces 6 MB, sends 1 KB: answered at once
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b'{"error":' in reply


def test_oversized_chunked_body_is_413(guarded: Server) -> None:
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ENV_KEY}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    piece = b"1" * 8192
    chunks = [b"%x\r\n%s\r\n" % (len(piece), piece)] * (2 * MAX_BODY // len(piece)) + [b"0\r\n\r\n"]
    reply = _raw_exchange(guarded, head, chunks)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b'{"error":' in reply


def test_small_chunked_body_is_read(guarded: Server) -> None:
    body = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 2, 2], "data": [0] * 12}]})
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ENV_KEY}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    reply = _raw_exchange(guarded, head, [b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)])
    assert reply.startswith(b"HTTP/1.1 400"), reply[:300]  # read and decoded: the shape is wrong for the model
    assert b"224" in reply


def test_deep_json_is_400(guarded: Server) -> None:
    deep: object = [1.0]
    for _ in range(10):
        deep = [deep]
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1], "parameters": {"x": deep}}]}
    reply = requests.post(guarded.url + f"/v2/models/{MODEL}/infer", json=body, headers=_auth(), timeout=10)
    assert reply.status_code == 400 and "nests deeper than 8" in reply.json()["error"]


def test_a_cached_reply_needs_the_key_too(guarded: Server) -> None:
    """Cache hits are answered before Flask (server.hit_path), behind the same API-key gate."""
    cat = (DATA / "chelsea-cat.jpg").read_bytes()
    assert len(cat) < MAX_BODY

    def post(path: str, headers: dict[str, str]) -> requests.Response:
        return requests.post(guarded.url + path, files={"image": ("cat.jpg", cat)}, headers=headers, timeout=30)

    for path in ("/predict", f"/v2/models/{MODEL}/classify"):
        assert post(path, _auth()).status_code == 200  # computed and stored (or already a hit)
        hit = post(path, _auth(FILE_KEY))
        assert hit.status_code == 200 and hit.headers["X-Cache"] == "HIT"
        for refused in ({}, _auth("wrong-key-0123456789"), {"Authorization": f"Basic {ENV_KEY}"}):
            reply = post(path, refused)
            assert reply.status_code == 401, (path, refused, reply.text[:200])
            assert reply.headers["WWW-Authenticate"].startswith("Bearer") and "X-Cache" not in reply.headers
            assert reply.json()["error"] in ("invalid API key", "missing API key: send 'Authorization: Bearer <key>'")
    assert post(f"/v2/models/{MODEL}x/classify", _auth()).status_code == 404  # another model's path: no hit


@pytest.mark.parametrize(
    "name", ["..%2F..%2Fetc%2Fpasswd", "..", "%2e%2e", "efficientnet-lite0%00", "a" * 3000, "..%252F..%252Fetc"]
)
def test_hostile_model_names_are_404_json(guarded: Server, name: str) -> None:
    for method, suffix in (("GET", ""), ("GET", "/ready"), ("POST", "/infer")):
        reply = requests.request(
            method, f"{guarded.url}/v2/models/{name}{suffix}", headers=_auth(), data=b"{}", timeout=10
        )
        assert reply.status_code == 404, (name[:40], suffix, reply.text[:200])
        assert "error" in reply.json()
