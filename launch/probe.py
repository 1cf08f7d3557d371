"""`python -m onnxpool.probe unix:/run/onnxpool/onnxpool.sock /v2/health/live`: an exec probe.

In the pod gunicorn listens only on a unix socket (nginx is the only way in from the
network), so the kubelet's HTTP probes cannot reach it; this one can. It asks one
path over the socket (or `HOST:PORT`) and exits 0 on a 200, 1 otherwise, with one line
on stderr. Standard library only, nothing of onnxpool imported: it runs every few
seconds in a CPU-limited container, so it must start fast.
"""

from __future__ import annotations

import http.client
import socket
import sys
from collections.abc import Sequence

TIMEOUT_SECONDS = 4.0  # under the probe's timeoutSeconds, so the probe reports our line


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def connection(address: str, timeout: float) -> http.client.HTTPConnection:
    if address.startswith("unix:"):
        return UnixConnection(address[len("unix:") :], timeout)
    host, _, port = address.rpartition(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def probe(address: str, path: str, timeout: float = TIMEOUT_SECONDS) -> str | None:
    """None when `path` answers 200, else what went wrong."""
    conn = connection(address, timeout)
    try:
        conn.request("GET", path)
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return f"{address}{path}: {exc.__class__.__name__}: {exc}"
    finally:
        conn.close()
    return None if status == 200 else f"{address}{path}: HTTP {status}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m onnxpool.probe unix:/path.sock|HOST:PORT /path", file=sys.stderr)
        return 2
    problem = probe(args[0], args[1])
    if problem is not None:
        print(f"probe failed: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
