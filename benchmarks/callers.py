"""Per-caller fairness on the several-models host: does one steady caller keep its answers while
another caller floods the same route?

Usage (from the repo root; needs models/minilm (`make minilm`) and Debian's `wrk`):
    git worktree add /tmp/onnxpool-old <commit> && make -C /tmp/onnxpool-old install
    .venv/bin/python -m benchmarks.callers --old /tmp/onnxpool-old [--sides today,callers]
        [--routes predict,embeddings] [--connections 16,64] [--duration 12s] [--warmup 2s]
        [--rounds 1] [--json out.json]

Both sides serve the same two-model file (benchmarks.isolation's: efficientnet-lite0 and
all-MiniLM-L6-v2, one core's budget each, from this checkout's model files) through the front
door (nginx), with the response cache off (and every request sent with `Cache-Control: no-store`,
so each one is computed) and `max_queue_ms = 250` for both models (`[models.<name>.limits]`):
  today    the checkout given by --old, served by its own venv (`onnxpool serve`), the file as is;
  callers  this checkout, the same file plus a `[callers]` section naming the callers by their
           `X-Caller` header (steady, flood).
For each route (`/predict` with the cat photo on the image model, then `/v1/embeddings` on
MiniLM, one sentence per request cycling through benchmarks.text_sentences in a fixed shuffled
order, `mixed_sentences`) and each side, after a warm-up, `--duration` seconds per phase:
  1. steady alone: ONE connection in a closed loop (its next request as soon as the reply
     arrives; onnxpool.measure.loadgen), header `X-Caller: steady`, answers counted by status;
  2. the same steady caller while wrk (`wrk -t1 -c16`, header `X-Caller: flood`) floods the SAME
     route (its lua script counts the flood's answers by status: 2xx, 503 shed, 429 refused);
  3. the same with the flood at 64 connections (`--connections`).
The sides are measured phase by phase, alternating (the order flips every phase, as in
benchmarks.zoo_ab), so the machine's drift falls on both; both hosts stay up (an idle worker
uses no CPU). Reported per phase: the steady caller's answers (200s) and answers/s and their
ratio to steady alone, its p50/p99 latency and the p99's ratio to alone, its shed (503) and
other errors; the flood's answers/s (2xx), its 503s and 429s, its tokens per answer on
/v1/embeddings (the work an answer stood for); the total answers/s (steady +
flood 2xx) and, for callers, its ratio to today's at the same flood.
Targets (issue 37), for the steady caller under either flood: >= 0.9x its answers/s alone,
p99 <= 2x its p99 alone, nothing shed (0 503s, no other error); and the host's total answers/s
>= 0.95x today's at the same flood (the fairness must not cost throughput).
Both load generators (the steady client's process and wrk's thread) run on this machine and
share its 2 cores with the servers: they take CPU the servers would otherwise have, alike on
both sides.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import REPO
from benchmarks.isolation import IMAGE_MODEL, MINILM, TWO_MODELS, WRK_SCRIPT
from benchmarks.output import emit
from benchmarks.text import request_body, workload
from benchmarks.text_sentences import sentences
from benchmarks.zoo_ab import zoo_host
from onnxpool.measure.cycle import RequestCycle
from onnxpool.measure.httpbench import parse_seconds
from onnxpool.measure.loadgen import LoadGenerator, StepPlan, Workload
from onnxpool.measure.paths import CAT_JPEG
from onnxpool.measure.payloads import BYPASS_CACHE, PreparedRequest, predict_request

SIDES = ("today", "callers")
MIX_SEED = 37
"""The order both callers send the sentences in (see `mixed_sentences`)."""
MAX_QUEUE_MS = 250
STEADY = {"X-Caller": "steady", **BYPASS_CACHE}
FLOOD_TAIL_S = 2.0
"""The flood runs this much longer than the steady caller's warm-up + window, so it covers the window."""

LIMITS = """
[models.efficientnet-lite0.limits]
max_queue_ms = {ms}
[models.all-minilm-l6-v2.limits]
max_queue_ms = {ms}
"""

CALLERS = """
[callers]
identify = "header"
header = "X-Caller"
hold_ms = {hold_ms}

[caller.steady]

[caller.flood]
"""

EMBEDDINGS_LUA = """\
-- POST /v1/embeddings, one sentence per request: the bodies file's lines in turn (benchmarks/callers.py)
local bodies = {}
for line in io.lines(os.getenv("CALLERS_BODIES")) do
  bodies[#bodies + 1] = line
end
local turn = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Cache-Control"] = "no-store"
function request()
  turn = turn % #bodies + 1
  return wrk.format(nil, nil, nil, bodies[turn])
end
"""

COUNTING_LUA = """\
-- The flood's caller, and its answers counted by status, printed when done (benchmarks/callers.py);
-- on /v1/embeddings also the work answered: the sum of the 200s' usage.prompt_tokens
wrk.headers["X-Caller"] = "flood"
local threads = {}
function setup(thread)
  threads[#threads + 1] = thread
end
function init(args)
  statuses = {}
  tokens = 0
end
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  if status == 200 then
    tokens = tokens + (tonumber(string.match(body, '"prompt_tokens":%s*(%d+)')) or 0)
  end
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("callers: seconds %.6f\\n", summary.duration / 1e6))
  io.write(string.format("callers: socket-errors %d\\n", e.connect + e.read + e.write + e.timeout))
  for _, thread in ipairs(threads) do
    io.write(string.format("callers: tokens %d\\n", thread:get("tokens")))
    for status, count in pairs(thread:get("statuses")) do
      io.write(string.format("callers: status %d %d\\n", status, count))
    end
  end
end
"""


@dataclass(frozen=True)
class Route:
    """One route measured: the steady caller's workload and the flood's lua script (its body)."""

    name: str
    path: str
    steady: Callable[[], Workload]
    flood_lua: str


def with_headers(request: PreparedRequest, headers: dict[str, str]) -> PreparedRequest:
    return dataclasses.replace(request, headers={**request.headers, **headers})


def steady_predict() -> Workload:
    return with_headers(predict_request(CAT_JPEG, 1), STEADY)


def mixed_sentences() -> list[str]:
    """benchmarks.text_sentences in a fixed shuffled order, for both the steady caller and the flood.

    The list keeps its long texts together (80 to 400 words at positions 182-195). A flood that
    sends it in order has a run of long requests in the queue at once: each waits behind the one
    before it, so the queue deadline sheds them together and the flood is answered mostly on its
    short texts (29-31 prompt tokens per answer in `flood tok/ans`, about 41 once shuffled),
    while the steady caller, never shed, is answered on all of them. Answers per second would then
    count different work on the two sides. Shuffled, the long texts are spread out and shedding
    takes short and long alike.
    """
    texts = sentences()
    return random.Random(MIX_SEED).sample(texts, len(texts))


def steady_embeddings() -> Workload:
    cycle = workload(mixed_sentences(), 1)
    return RequestCycle(tuple(with_headers(request, STEADY) for request in cycle.requests))


ROUTES = {
    "predict": Route("predict", "/predict", steady_predict, WRK_SCRIPT + COUNTING_LUA),
    "embeddings": Route("embeddings", "/v1/embeddings", steady_embeddings, EMBEDDINGS_LUA + COUNTING_LUA),
}


@dataclass(frozen=True)
class Flood:
    """What wrk counted over its whole run (its ramp-up included)."""

    seconds: float
    statuses: dict[int, int]
    non_2xx: int
    socket_errors: int
    tokens: int = 0
    """The 200s' usage.prompt_tokens summed (/v1/embeddings; 0 elsewhere)."""

    @property
    def answered(self) -> int:
        return sum(count for status, count in self.statuses.items() if 200 <= status < 300)

    @property
    def answers_per_s(self) -> float:
        return self.answered / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_answer(self) -> float:
        return self.tokens / self.answered if self.tokens and self.answered else math.nan


def parse_flood(stdout: str) -> Flood:
    """wrk's output with COUNTING_LUA's lines: the run's seconds, the answers by status, the errors."""
    seconds = re.search(r"^callers: seconds ([\d.]+)$", stdout, re.MULTILINE)
    sockets = re.search(r"^callers: socket-errors (\d+)$", stdout, re.MULTILINE)
    tokens = sum(int(count) for count in re.findall(r"^callers: tokens (\d+)$", stdout, re.MULTILINE))
    if seconds is None or sockets is None:
        raise RuntimeError(f"wrk printed no counts:\n{stdout}")
    statuses: Counter[int] = Counter()
    for status, count in re.findall(r"^callers: status (\d+) (\d+)$", stdout, re.MULTILINE):
        statuses[int(status)] += int(count)
    # wrk's own count of the answers it calls failed (>= 400), beside the lua script's by status
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", stdout)
    return Flood(
        float(seconds.group(1)), dict(statuses), int(non_2xx.group(1)) if non_2xx else 0, int(sockets.group(1)), tokens
    )


def run_flood(url: str, route: Route, connections: int, seconds: float, folder: Path) -> Flood:
    """`wrk -t1 -c<connections>` on the route for `seconds` (whole seconds, rounded up)."""
    script = folder / f"flood-{route.name}.lua"
    script.write_text(route.flood_lua, encoding="utf-8")
    bodies = folder / "embeddings-bodies.txt"
    if not bodies.is_file():
        bodies.write_bytes(b"\n".join(request_body([text]) for text in mixed_sentences()) + b"\n")
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{math.ceil(seconds)}s", "--timeout", "10s"]
    argv += ["-s", str(script), url + route.path]
    env = {**os.environ, "ISOLATION_IMAGE": str(CAT_JPEG), "CALLERS_BODIES": str(bodies)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout} {done.stderr}")
    return parse_flood(done.stdout)


@dataclass(frozen=True)
class Phase:
    """One phase of one side on one route (flood_connections 0: the steady caller alone)."""

    route: str
    side: str
    flood_connections: int
    steady_answers: int
    steady_per_s: float
    steady_p50_ms: float
    steady_p99_ms: float
    steady_shed: int
    steady_errors: int
    flood_per_s: float
    flood_503: int
    flood_429: int
    flood_errors: int
    flood_tokens_per_answer: float
    """/v1/embeddings: the flood's answered work per answer (usage.prompt_tokens); nan on /predict."""
    total_per_s: float


def measure_phase(
    generator: LoadGenerator, url: str, route: Route, side: str, connections: int, args: argparse.Namespace, tmp: Path
) -> Phase:
    """The steady caller (drained warm-up, then warm-up and window), under a flood of `connections` (0: none)."""
    floods: list[Flood] = []
    thread = None
    if connections:
        seconds = args.warmup * 2 + args.duration + FLOOD_TAIL_S
        thread = threading.Thread(target=lambda: floods.append(run_flood(url, route, connections, seconds, tmp)))
        thread.start()
    try:
        generator.run_step(StepPlan(1, warmup=0.0, duration=args.warmup))
        step = generator.run_step(StepPlan(1, warmup=args.warmup, duration=args.duration))
    finally:
        if thread is not None:
            thread.join()
    if connections and not floods:
        raise RuntimeError(f"{side} {route.name}: the flood at {connections} connections failed (see above)")
    flood = floods[0] if floods else Flood(1.0, {}, 0, 0)
    answered = step.ok > 0
    shed = step.errors.get("503", 0)
    phase = Phase(
        route=route.name,
        side=side,
        flood_connections=connections,
        steady_answers=step.ok,
        steady_per_s=round(step.throughput, 2),
        steady_p50_ms=round(step.percentile(50) * 1000, 2) if answered else math.nan,
        steady_p99_ms=round(step.percentile(99) * 1000, 2) if answered else math.nan,
        steady_shed=shed,
        steady_errors=step.error_count - shed,
        flood_per_s=round(flood.answers_per_s, 2),
        flood_503=flood.statuses.get(503, 0),
        flood_429=flood.statuses.get(429, 0),
        flood_errors=flood.non_2xx - flood.statuses.get(503, 0) - flood.statuses.get(429, 0) + flood.socket_errors,
        flood_tokens_per_answer=round(flood.tokens_per_answer, 1),
        total_per_s=round(step.throughput + flood.answers_per_s, 2),
    )
    what = f"flood {connections} conns" if connections else "alone"
    kinds = f" {dict(step.errors)}" if step.errors else ""
    print(
        f"  {route.name} {side} {what}: steady {phase.steady_answers} answers ({phase.steady_per_s:.1f}/s), "
        f"p50 {phase.steady_p50_ms:.1f} p99 {phase.steady_p99_ms:.1f} ms, shed {shed}{kinds}"
        + (
            f"; flood {phase.flood_per_s:.1f}/s, 503 {phase.flood_503}, 429 {phase.flood_429}, "
            f"other {phase.flood_errors}{tokens_text(phase)}; total {phase.total_per_s:.1f}/s"
            if connections
            else ""
        ),
        file=sys.stderr,
        flush=True,
    )
    return phase


def tokens_text(phase: Phase, missing: str = "", form: str = ", {:.1f} tok/ans") -> str:
    """The flood's tokens per answer as `form` puts it, or `missing` where none were counted (/predict)."""
    return missing if math.isnan(phase.flood_tokens_per_answer) else form.format(phase.flood_tokens_per_answer)


def settings_file(folder: Path, callers: bool, hold_ms: float = 3.0) -> Path:
    """The two-model file (cache off, max_queue_ms for both models), with the [callers] section or without."""
    text = TWO_MODELS.format(budgets="auto", image=IMAGE_MODEL, minilm=MINILM, image_workers=2)
    text += LIMITS.format(ms=MAX_QUEUE_MS) + (CALLERS.format(hold_ms=hold_ms) if callers else "")
    path = folder / ("callers.toml" if callers else "today.toml")
    path.write_text(text, encoding="utf-8")
    return path


def combined(phases: list[Phase]) -> Phase:
    """One phase's rounds: each rate and latency their median, each count their sum."""
    values: dict[str, Any] = {}
    for item in dataclasses.fields(Phase):
        numbers = [getattr(phase, item.name) for phase in phases]
        if item.type == "float":
            values[item.name] = round(float(statistics.median(numbers)), 2)
        elif item.type == "int" and item.name != "flood_connections":
            values[item.name] = sum(numbers)
        else:
            values[item.name] = numbers[0]
    return Phase(**values)


def ratio(value: float, base: float) -> float:
    return value / base if base > 0 else math.nan


def alone_of(phase: Phase, phases: list[Phase]) -> Phase:
    return next(p for p in phases if (p.route, p.side, p.flood_connections) == (phase.route, phase.side, 0))


def today_of(phase: Phase, phases: list[Phase]) -> Phase | None:
    key = (phase.route, "today", phase.flood_connections)
    return next((p for p in phases if (p.route, p.side, p.flood_connections) == key), None)


def table(route: str, phases: list[Phase]) -> str:
    lines = [
        f"### {route}",
        "| side | flood conns | steady ans/s | vs alone | steady p50 ms | steady p99 ms | vs alone | steady shed"
        " | flood ans/s | flood 503 / 429 | flood tok/ans | total ans/s | total vs today |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for phase in (p for p in phases if p.route == route):
        alone = alone_of(phase, phases)
        today = today_of(phase, phases)
        flooded = phase.flood_connections > 0
        shed = f"{phase.steady_shed}" + (f" (+{phase.steady_errors} errors)" if phase.steady_errors else "")
        lines.append(
            f"| {phase.side} | {phase.flood_connections if flooded else 'alone'} | {phase.steady_per_s:.1f} | "
            f"{ratio(phase.steady_per_s, alone.steady_per_s):.2f}x | {phase.steady_p50_ms:.1f} | "
            f"{phase.steady_p99_ms:.1f} | {ratio(phase.steady_p99_ms, alone.steady_p99_ms):.2f}x | {shed} | "
            + (
                f"{phase.flood_per_s:.1f} | {phase.flood_503} / {phase.flood_429} | "
                f"{tokens_text(phase, '-', '{:.1f}')} | "
                if flooded
                else "- | - | - | "
            )
            + f"{phase.total_per_s:.1f} | "
            + (f"{ratio(phase.total_per_s, today.total_per_s):.2f}x |" if today and phase.side != "today" else "- |")
        )
    return "\n".join(lines)


def verdicts(phases: list[Phase]) -> list[str]:
    """Each flooded phase against the targets of issue 37."""
    lines = []
    for phase in phases:
        if not phase.flood_connections:
            continue
        alone = alone_of(phase, phases)
        today = today_of(phase, phases)
        answers = ratio(phase.steady_per_s, alone.steady_per_s)
        p99 = ratio(phase.steady_p99_ms, alone.steady_p99_ms)
        checks = [
            (f"steady {answers:.2f}x its answers alone (>= 0.9)", answers >= 0.9),
            (f"p99 {p99:.2f}x alone (<= 2)", p99 <= 2.0),
            (
                f"{phase.steady_shed} shed, {phase.steady_errors} other errors (0)",
                phase.steady_shed + phase.steady_errors == 0,
            ),
        ]
        if today is not None and phase.side != "today":
            total = ratio(phase.total_per_s, today.total_per_s)
            checks.append((f"total {total:.2f}x today's (>= 0.95)", total >= 0.95))
        met = all(ok for _, ok in checks)
        text = "; ".join(f"{what} {'ok' if ok else 'MISSED'}" for what, ok in checks)
        lines.append(
            f"{phase.route}, {phase.side}, flood {phase.flood_connections}: {'MET' if met else 'NOT MET'}: {text}"
        )
    return lines


def measure_route(
    route: Route, urls: dict[str, str], connections: list[int], args: argparse.Namespace, folder: Path
) -> list[Phase]:
    """Every phase of every side on one route, the sides alternating (the order flips every phase)."""
    measured: list[Phase] = []
    sides = list(urls)
    with ExitStack() as clients:
        generators = {side: clients.enter_context(LoadGenerator(url, route.steady(), 1)) for side, url in urls.items()}
        for round_ in range(args.rounds):
            for index, flood in enumerate(connections):
                flip = (round_ * len(connections) + index) % 2
                for side in sides[::-1] if flip else sides:
                    measured.append(measure_phase(generators[side], urls[side], route, side, flood, args, folder))
    return measured


def comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="the checkout serving `today` (with its own .venv)")
    parser.add_argument("--sides", default=",".join(SIDES), help="sides to run, of today,callers (both)")
    parser.add_argument("--routes", default=",".join(ROUTES), help="routes to run, of predict,embeddings (both)")
    parser.add_argument("--connections", default="16,64", help="the flood's connections, one phase each (16,64)")
    parser.add_argument("--duration", type=parse_seconds, default=12.0, help="measured seconds per phase (12s)")
    parser.add_argument("--warmup", type=parse_seconds, default=2.0, help="unmeasured seconds before each (2s)")
    parser.add_argument("--rounds", type=int, default=1, help="measurements of each phase (1; medians shown)")
    parser.add_argument(
        "--hold-ms", type=float, default=3.0, help="the callers side's [callers] hold_ms (3, the default; 0: no hold)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    sides = comma_list(args.sides)
    routes = comma_list(args.routes)
    connections = [0, *(int(n) for n in comma_list(args.connections))]
    unknown = sorted(set(sides) - set(SIDES)) + sorted(set(routes) - set(ROUTES))
    if unknown or not sides or not routes:
        parser.error(f"unknown or no sides/routes: {unknown}")
    if not MINILM.is_file():
        print(f"{MINILM} is missing: build it with `make minilm`", file=sys.stderr)
        return 1
    checkouts = {"today": args.old.resolve(), "callers": REPO}
    measured: list[Phase] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        urls = {}
        for side in sides:
            config = settings_file(folder, callers=side == "callers", hold_ms=args.hold_ms)
            server, seconds = stack.enter_context(zoo_host(checkouts[side], config, folder, side))
            print(f"{side} ({checkouts[side]}) ready in {seconds:.1f} s at {server.url}", file=sys.stderr, flush=True)
            urls[side] = server.url
        for name in routes:
            measured += measure_route(ROUTES[name], urls, connections, args, folder)
    summary = [
        combined([p for p in measured if (p.route, p.side, p.flood_connections) == (name, side, flood)])
        for name in routes
        for side in sides
        for flood in connections
    ]
    for name in routes:
        print(table(name, summary) + "\n")
    lines = verdicts(summary)
    for line in lines:
        print(line)
    emit(
        {
            "sides": {side: str(checkouts[side]) for side in sides},
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "rounds": args.rounds,
            "max_queue_ms": MAX_QUEUE_MS,
            "summary": [dataclasses.asdict(phase) for phase in summary],
            "phases": [dataclasses.asdict(phase) for phase in measured],
            "verdicts": lines,
        },
        args.json,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
