"""A cache hit's server time, this checkout against another, finely interleaved: no slower?

    .venv/bin/python -m benchmarks.hits_ab --old /tmp/onnxpool-old [--rounds 24] [--hits 250]

`benchmarks.ab` measures hits in a few long rounds after its throughput rounds; a hit takes ~0.2 ms,
so its rounds drift by as much as a change costs (the same checkout against itself: 0.955x). Here two
servers (each checkout's own venv and configuration, the response cache on) stay up and take `--hits`
cat photos each in turn, `--rounds` times, the order swapped every round, over one keep-alive
connection each: the p50 of the `Server-Timing` total of every HIT, and the median of the rounds' p50s.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import requests

from benchmarks.ab import REPO, checkout_server
from benchmarks.output import emit
from onnxpool.measure.paths import CAT_JPEG

TOTAL = re.compile(r"total;dur=([0-9.]+)")


def hit_times(session: requests.Session, url: str, image: bytes, count: int) -> list[float]:
    """Server-Timing totals (ms) of the HITs among `count` posts of `image`."""
    found = []
    for _ in range(count):
        reply = session.post(url + "/predict", files={"image": ("cat.jpg", image, "image/jpeg")}, timeout=30)
        reply.raise_for_status()
        match = TOTAL.search(reply.headers.get("Server-Timing", ""))
        if reply.headers.get("X-Cache") == "HIT" and match is not None:
            found.append(float(match.group(1)))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="the other checkout (with its own .venv)")
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--hits", type=int, default=250)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    image = CAT_JPEG.read_bytes()
    sides = {"old": args.old.resolve(), "new": REPO}
    totals: dict[str, list[float]] = {side: [] for side in sides}
    rounds: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        servers = {
            side: stack.enter_context(checkout_server(path, Path(tmp), f"{side}-on", {}))
            for side, path in sides.items()
        }
        sessions = {side: stack.enter_context(requests.Session()) for side in sides}
        for side in sides:
            hit_times(sessions[side], servers[side].url, image, 1)  # the miss that stores the reply
        for index in range(args.rounds):
            order = list(sides) if index % 2 == 0 else list(sides)[::-1]
            for side in order:
                times = hit_times(sessions[side], servers[side].url, image, args.hits)
                totals[side] += times
                rounds[side].append(statistics.median(times))
            print(f"round {index + 1}/{args.rounds}: " + ", ".join(f"{s} {rounds[s][-1]:.3f} ms" for s in sides),
                  file=sys.stderr)  # fmt: skip
    p50 = {side: statistics.median(values) for side, values in totals.items()}
    result: dict[str, object] = {
        side: {
            "hits": len(totals[side]),
            "p50_ms": round(p50[side], 4),
            "median_of_round_p50s_ms": round(statistics.median(rounds[side]), 4),
        }
        for side in sides
    }
    result["new_over_old"] = round(p50["new"] / p50["old"], 3)
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
