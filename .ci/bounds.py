"""onnxpool at both ends of its protobuf and grpcio ranges: the gRPC and tracing tests in each.

    .venv/bin/python .ci/bounds.py [lowest|newest ...]      (`make bounds`; .ci/run runs it)

setup.cfg declares protobuf, grpcio and OpenTelemetry by the range the code works with, and the dev
environment holds one point of it (whatever tritonclient and the dev tools settle on). This installs
onnxpool (not editable: the package as a user gets it) into a small venv per end, build/bounds/END/,
and runs the tests that load the generated stubs and the exporter there:

- lowest: every lower bound of setup.cfg for those packages, exactly (the versions README names);
  the KServe stub generator (tests/kserve_stub_client.py) is grpcio-tools of the same release.
- newest: the newest release each range admits. tritonclient, the tests' client, pins protobuf <7
  (2.73); its pin is overridden by onnxpool's own range here (uv's --override) so that the server
  side meets the newest protobuf; the client's stubs load on it (gencode 6, within the window).

uv (the Makefile's `make lock` pin) makes the venvs: with its cache an end installs in seconds.
"""

from __future__ import annotations

import configparser
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
VENVS = REPO / "build" / "bounds"
UV = ("uv==0.13.8",)
RANGED = (
    "protobuf",
    "grpcio",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-http",
)
"""The packages whose both ends are tested: the generated stubs' runtime and the tracing exporter's."""
TEST_TOOLS = ("pytest", "onnx", "openai", "tritonclient[grpc,http]")
TESTS = (
    "tests/test_grpc.py",
    "tests/test_grpc_health.py",
    "tests/test_grpc_gencode.py",
    "tests/test_grpc_wire.py",
    "tests/test_grpc_reply_metadata.py",
    "tests/test_tracing_parts.py",
    "tests/test_tracing.py",
)
AT_NEITHER_END = ("tests/test_grpc.py::test_a_grpc_flood_cannot_starve_a_steady_grpc_caller",)
"""onnxpool's own admission under a flood (8 s, the slowest): `make test` has it; it adds no version check."""
LIFECYCLE = (
    "tests/test_grpc.py::test_hup_under_a_grpc_load_loses_nothing",
    "tests/test_grpc.py::test_a_killed_worker_costs_a_retrying_client_nothing",
    "tests/test_grpc.py::test_shed_calls_and_a_call_in_flight_during_sigterm",
    "tests/test_tracing.py::test_spans_of_every_worker_arrive_after_hup_and_term",
)
"""The slowest third: workers under load, HUP, TERM and KILL, which hang on grpcio's server (and the SDK's
shutdown), not on protobuf's messages. An end whose grpcio and OpenTelemetry SDK are the dev environment's
own (the newest, usually) skips them: `make test` has just run them on those very versions."""
SHOWN = (*RANGED, "grpcio-tools", "tritonclient", "onnxpool")


def requirements() -> dict[str, Requirement]:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg", encoding="utf-8")
    lines = [line.split("#")[0].strip() for line in config["options"]["install_requires"].splitlines()]
    return {req.name: req for req in (Requirement(line) for line in lines if line)}


def floor(req: Requirement) -> str:
    (version,) = [spec.version for spec in req.specifier if spec.operator == ">="]
    return version


def pins(end: str) -> tuple[list[str], list[str]]:
    """(requirements, overrides) for uv at one end."""
    reqs = requirements()
    if end == "lowest":
        exact = [f"{name}=={floor(reqs[name])}" for name in RANGED]
        return [*exact, f"grpcio-tools=={floor(reqs['grpcio'])}"], []
    return ["grpcio-tools"], [str(reqs["protobuf"])]


def uv() -> str:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *UV], check=True)
    return str(Path(sys.executable).parent / "uv")


def install(end: str, uv_bin: str) -> Path:
    venv = VENVS / end
    subprocess.run([uv_bin, "venv", "--quiet", "--clear", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    extra, overrides = pins(end)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as override_file:
        override_file.write("\n".join(overrides) + "\n")
        override_file.flush()
        argv = [uv_bin, "pip", "install", "--quiet", "--python", str(python), "--override", override_file.name]
        subprocess.run([*argv, str(REPO), *TEST_TOOLS, *extra], check=True)
    return python


def versions(python: Path | str, names: tuple[str, ...] = SHOWN) -> dict[str, str]:
    script = "import importlib.metadata as md, sys; print(*(md.version(n) for n in sys.argv[1:]))"
    names = tuple(name.split("[")[0] for name in names)
    out = subprocess.run([str(python), "-c", script, *names], capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.split(), strict=True))


def deselected(installed: dict[str, str]) -> list[str]:
    """LIFECYCLE, where this end's grpcio and SDK are the ones this (the dev) environment has."""
    here = versions(sys.executable, ("grpcio", "opentelemetry-sdk"))
    same = all(installed[name] == version for name, version in here.items())
    return [f"--deselect={test}" for test in LIFECYCLE] if same else []


def main(ends: list[str]) -> int:
    began = time.monotonic()
    uv_bin = uv()
    failed = []
    for end in ends:
        started = time.monotonic()
        python = install(end, uv_bin)
        installed = versions(python)
        shown = ", ".join(f"{name} {version}" for name, version in installed.items())
        skips = deselected(installed)
        print(f"--- {end}: {shown} (installed in {time.monotonic() - started:.0f} s)", flush=True)
        if skips:
            print(f"--- {end}: grpcio and the SDK as in {sys.prefix}: {len(skips)} lifecycle tests left to `make test`")
        pytest = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5"]
        never = [f"--deselect={test}" for test in AT_NEITHER_END]
        tests = subprocess.run([*pytest, *never, *skips, *TESTS], cwd=REPO, check=False)
        print(
            f"--- {end}: tests {'passed' if tests.returncode == 0 else 'FAILED'} in {time.monotonic() - started:.0f} s"
        )
        if tests.returncode != 0:
            failed.append(end)
    print(f"--- both ends: {time.monotonic() - began:.0f} s{', FAILED: ' + ' '.join(failed) if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["lowest", "newest"]))
