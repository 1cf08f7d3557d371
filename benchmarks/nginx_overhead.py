"""What nginx costs: v2 binary infer throughput direct vs through nginx, in ONE run.

Starts one onnxpool (demo model, workers = usable cores) and nginx in front of
it with the site `onnxpool nginx-config` renders, then runs the same closed
loop (N clients, one request in flight each) against each, alternating rounds
so drifting machine load hits both alike. Prints a table and the ratio.

    .venv/bin/python -m benchmarks.nginx_overhead --seconds 20 --concurrency 4

Clients, nginx and workers share this machine's cores: with workers = cores,
nginx's CPU (copying ~600 KB in and the reply out per request) is taken from
inference. `--workers` (cores - 1) leaves it a core, like a real deployment
where nginx and the clients run elsewhere.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from onnxpool.measure.httpbench import BenchOptions, run_bench
from tests.deploy_harness import nginx_binary, start_instance, start_nginx
from tests.harness import MODEL_NAME, free_port


@dataclass
class Totals:
    ok: int = 0
    failed: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


def measure(url: str, concurrency: int, seconds: float, totals: Totals) -> float:
    """One closed-loop step with the light load generator (bench.loadgen); adds to totals, returns req/s."""
    options = BenchOptions(
        url=url, mode="v2-binary", concurrency=(concurrency,), warmup=1.0, duration=seconds, model=MODEL_NAME
    )
    step = run_bench(options).steps[0]
    totals.ok += step.ok
    totals.failed += step.requests - step.ok
    totals.seconds += step.seconds
    return step.throughput


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per target (split in rounds)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per target")
    parser.add_argument("--concurrency", type=int, default=4, help="clients, one request in flight each")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="onnxpool workers")
    args = parser.parse_args(argv)
    if nginx_binary() is None:
        print("nginx is not installed (apt-get install nginx-light)", file=sys.stderr)
        return 1

    with tempfile.TemporaryDirectory(prefix="onxp-bench-") as tmp:
        tmp_path = Path(tmp)
        print(f"starting onnxpool ({args.workers} workers) and nginx ...", file=sys.stderr)
        instance = start_instance(tmp_path, f"127.0.0.1:{free_port()}", workers=args.workers)
        nginx = None
        try:
            nginx = start_nginx(tmp_path, [instance.upstream])
            targets = {"direct": instance.url, "nginx": nginx.url}
            totals = {name: Totals() for name in targets}
            per_round = args.seconds / args.rounds
            for round_no in range(args.rounds):
                for name, url in targets.items():
                    rate = measure(url, args.concurrency, per_round, totals[name])
                    print(f"round {round_no + 1}/{args.rounds} {name:<6} {rate:7.1f} req/s", file=sys.stderr)
        finally:
            if nginx is not None:
                nginx.stop()
            instance.stop()

    print(f"\nv2 binary infer, 1x3x224x224 FP32, concurrency {args.concurrency}, {args.workers} workers")
    print(f"{'path':<8}{'requests':>10}{'failed':>8}{'seconds':>9}{'req/s':>9}")
    for name, stats in totals.items():
        print(f"{name:<8}{stats.ok:>10}{stats.failed:>8}{stats.seconds:>9.1f}{stats.rate:>9.1f}")
    ratio = totals["nginx"].rate / totals["direct"].rate if totals["direct"].rate else 0.0
    print(f"nginx / direct = {ratio:.3f} (target >= 0.90)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
