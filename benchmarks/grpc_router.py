"""What the host's gRPC router costs: ModelInfer through the host's one gRPC port vs straight to the pool.

Starts a several-models host (`onnxpool serve` on a `[models.<name>]` file with `[server] grpc_bind`):
the image model (efficientnet-lite0, a 1x3x224x224 FP32 tensor, ~600 KB per call) and iris (4 floats),
one single-threaded worker each. The same tritonclient.grpc calls then go, in alternating rounds so
that drifting machine load hits both alike, to the router (`[server] grpc_bind`) and straight to the
model's pool (its loopback gRPC port in host.json): the difference is the router's hop. One call in
flight (concurrency 1: the latency a call pays) and a few (the throughput a host keeps). The router's
own CPU per call is read from /proc.

    .venv/bin/python -m benchmarks.grpc_router --calls 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from onnxpool.measure.servers import cpu_seconds
from tests.harness import free_port
from tests.host_harness import (
    IMAGE_MODEL,
    SETOSA,
    image_table,
    iris_table,
    one_worker,
    start_host,
    write_settings,
)


@dataclass
class Side:
    latencies: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)


def inputs(model: str) -> tuple[list[grpcclient.InferInput], str]:
    if model == "iris":
        tensor = grpcclient.InferInput("input", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.array([SETOSA], dtype=np.float32))
        return [tensor], "probabilities"
    tensor = grpcclient.InferInput("input", [1, 3, 224, 224], "FP32")
    tensor.set_data_from_numpy(np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32))
    return [tensor], "logits"


def sequential(address: str, model: str, calls: int) -> list[float]:
    """`calls` ModelInfer one after another on one channel: each call's seconds."""
    client = grpcclient.InferenceServerClient(address)
    tensors, output = inputs(model)
    for _ in range(20):  # the channel's connection and the worker's caches
        client.infer(model, tensors, outputs=[grpcclient.InferRequestedOutput(output)])
    seconds = []
    for _ in range(calls):
        t0 = time.perf_counter()
        client.infer(model, tensors, outputs=[grpcclient.InferRequestedOutput(output)])
        seconds.append(time.perf_counter() - t0)
    client.close()
    return seconds


def parallel(address: str, model: str, clients: int, seconds: float) -> float:
    """`clients` closed loops (a channel each) for `seconds`: calls per second."""
    deadline = time.monotonic() + seconds

    def loop() -> int:
        client = grpcclient.InferenceServerClient(address)
        tensors, output = inputs(model)
        done = 0
        while time.monotonic() < deadline:
            client.infer(model, tensors, outputs=[grpcclient.InferRequestedOutput(output)])
            done += 1
        client.close()
        return done

    with ThreadPoolExecutor(clients) as pool:
        return sum(pool.map(lambda _: loop(), range(clients))) / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--calls", type=int, default=1000, help="sequential calls per side and round (iris; image / 10)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--clients", type=int, default=4, help="closed loops of the throughput step")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per side and round of the throughput step")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="onxp-grpc-router-") as tmp:
        folder = Path(tmp)
        router = f"127.0.0.1:{free_port()}"
        config = write_settings(
            folder / "host.toml",
            # The same tensor every call: the response cache would answer all but the first.
            image_table("image", IMAGE_MODEL, one_worker(1.0) + "cache = false\n"),
            iris_table("iris", one_worker(1.0) + "cache = false\n"),
            server=f'grpc_bind = "{router}"\n',
        )
        print("starting the host ...", file=sys.stderr)
        host = start_host(folder, config)
        try:
            direct = {name: str(model["grpc_address"]) for name, model in host.host_json().items()}
            router_pid = host.program("grpc")
            rows = []
            for model in ("image", "iris"):
                calls = args.calls if model == "iris" else max(50, args.calls // 10)
                sides = {"router": Side(), "direct": Side()}
                cpu = 0.0
                routed_calls = 0
                for round_no in range(args.rounds):
                    for name, address in (("router", router), ("direct", direct[model])):
                        before = cpu_seconds([router_pid])
                        sides[name].latencies += sequential(address, model, calls)
                        sides[name].rates.append(parallel(address, model, args.clients, args.seconds))
                        if name == "router":
                            cpu += cpu_seconds([router_pid]) - before
                            routed_calls += calls + 20 + int(sides[name].rates[-1] * args.seconds)
                    print(f"{model}: round {round_no + 1}/{args.rounds}", file=sys.stderr)
                p50 = {name: statistics.median(side.latencies) * 1e6 for name, side in sides.items()}
                mean = {name: statistics.fmean(side.latencies) * 1e6 for name, side in sides.items()}
                rate = {name: statistics.median(side.rates) for name, side in sides.items()}
                rows.append(
                    f"| {model} | {p50['direct']:.0f} µs | {p50['router']:.0f} µs | "
                    f"+{p50['router'] - p50['direct']:.0f} µs ({(p50['router'] / p50['direct'] - 1) * 100:.1f} %) | "
                    f"+{mean['router'] - mean['direct']:.0f} µs | "
                    f"{rate['direct']:.0f} / {rate['router']:.0f} ({rate['router'] / rate['direct']:.3f}x) | "
                    f"{cpu / routed_calls * 1e6:.0f} µs |"
                )
        finally:
            host.stop()
    print(
        f"\n| model | p50 direct (c=1) | p50 via router | router's hop (p50) | hop (mean) | "
        f"calls/s direct / router (c={args.clients}) | router CPU per call |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
