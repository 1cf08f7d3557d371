"""An OTLP/HTTP trace endpoint that accepts and discards: what tracing costs the server, not the collector.

    python -m benchmarks.trace_sink --port 4318      # POST /v1/traces -> 200, counted, body dropped
    python -m benchmarks.trace_sink --port 8099 --delay 2   # every POST answered 2 s late (a slow sink)

benchmarks.ab --trace-sink starts one for the new side's servers (`[tracing] endpoint`), so the
A/B measures a traced server against an untraced one without a collector's decoding sharing the
machine's cores. It answers as the OTLP spec's success does (an empty ExportTraceServiceResponse)
and prints, when stopped, how many exports and bytes it took.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType


class Sink(BaseHTTPRequestHandler):
    exports = 0
    received = 0
    delay = 0.0

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if Sink.delay:
            time.sleep(Sink.delay)
        Sink.exports += 1
        Sink.received += length
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return  # one line per export would cost more than the export


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer (a slow sink)")
    args = parser.parse_args(argv)
    Sink.delay = args.delay
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Sink)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        print(f"trace sink: {Sink.exports} exports, {Sink.received} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
