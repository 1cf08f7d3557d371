"""Tracing's parts without a server: the settings and the plan, the SDK's counted queue, the bounded exit,
and that a server with tracing off never imports OpenTelemetry (tests/test_tracing.py runs it all for real).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from onnxpool.config.loader import ConfigError, load_settings
from onnxpool.server.tracing_export import CountingExporter, CountingProcessor, start
from onnxpool.server.tracing_plan import TracingPlan, plan_tracing
from tests.harness import REPO, free_port


def plan(**env: str) -> TracingPlan | None:
    loaded = load_settings(environ={k: v for k, v in env.items() if k.startswith("ONNXPOOL_")})
    return plan_tracing(loaded.settings, "tensors", {k: v for k, v in env.items() if not k.startswith("ONNXPOOL_")})


def test_tracing_is_off_unless_an_endpoint_is_given() -> None:
    assert plan() is None
    on = plan(ONNXPOOL_TRACING__ENDPOINT="http://collector:4318")
    assert on is not None and on.endpoint == "http://collector:4318/v1/traces"
    assert on.service_name == "efficientnet-lite0" and on.sample_ratio == 1.0 and on.task == "tensors"
    # The OTLP spec's variables: the traces endpoint as it is; the service name; the SDK switched off.
    tempo = "https://tempo.example:4318/otlp/v1/traces"
    by_otel = plan(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=tempo, OTEL_SERVICE_NAME="a")
    assert by_otel is not None and by_otel.endpoint == tempo
    assert by_otel.service_name == "a"
    assert plan(ONNXPOOL_TRACING__ENDPOINT="http://c:4318", OTEL_SDK_DISABLED="true") is None
    # onnxpool's own setting wins over the environment's OTEL_* (as code configuration does in the SDKs).
    both = plan(
        ONNXPOOL_TRACING__ENDPOINT="http://c:4318/v1/traces/",
        ONNXPOOL_TRACING__SERVICE_NAME="zoo",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://other:4318/v1/traces",
        OTEL_SERVICE_NAME="other",
    )
    assert both is not None and both.endpoint == "http://c:4318/v1/traces" and both.service_name == "zoo"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ONNXPOOL_TRACING__ENDPOINT": "collector:4318"}, "tracing.endpoint"),
        ({"ONNXPOOL_TRACING__ENDPOINT": "http://c:99999"}, "tracing.endpoint"),
        ({"ONNXPOOL_TRACING__SAMPLE_RATIO": "1.5"}, "tracing.sample_ratio"),
        ({"ONNXPOOL_TRACING__FLUSH_TIMEOUT_SECONDS": "0"}, "tracing.flush_timeout_seconds"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "grpc://c:4317"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    ],
)
def test_a_bad_tracing_setting_is_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan(**env)


class Stuck(SpanExporter):
    """An exporter whose collector does not answer until `answer` is set."""

    def __init__(self) -> None:
        self.answer = threading.Event()
        self.exporting = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exporting.set()
        self.answer.wait(10)
        return SpanExportResult.SUCCESS


def test_the_spans_a_full_queue_drops_are_counted() -> None:
    counted: list[tuple[str, int]] = []
    stuck = Stuck()
    exporter = CountingExporter(stuck, lambda outcome, n: counted.append((outcome, n)))
    provider = TracerProvider(shutdown_on_exit=False)
    options = {"max_queue_size": 4, "max_export_batch_size": 2, "schedule_delay_millis": 5}
    provider.add_span_processor(CountingProcessor(exporter, exporter.count, **options))
    tracer = provider.get_tracer("test")
    for i in range(2):  # the first batch, stuck in export from here on: the queue is only filled meanwhile
        tracer.start_span(f"span {i}").end()
    assert stuck.exporting.wait(10)
    for i in range(2, 20):  # 4 wait; the rest push the oldest out
        tracer.start_span(f"span {i}").end()
    stuck.answer.set()
    provider.shutdown()
    dropped = sum(n for outcome, n in counted if outcome == "queue_full")
    exported = sum(n for outcome, n in counted if outcome == "exported")
    assert dropped >= 10 and exported + dropped == 20, counted


def test_an_exit_waits_for_a_dead_collector_no_longer_than_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "30")  # the exporter would retry for 30 s
    counted: list[tuple[str, int]] = []
    unreachable = TracingPlan(f"http://127.0.0.1:{free_port()}/v1/traces", 1.0, "test", "m", "tensors", 0.5)
    exporting = start(unreachable, lambda outcome, n: counted.append((outcome, n)), schedule_delay_millis=10)
    for _ in range(5):
        exporting.tracer.start_span("lost").end()
    time.sleep(0.2)  # the export is retrying by now
    started = time.monotonic()
    exporting.close(0.5)
    assert time.monotonic() - started < 3.0
    assert sum(n for outcome, n in counted if outcome == "export_failed") == 5, counted


OFF_OR_ON = """
import sys
from onnxpool.config.loader import load_settings
from onnxpool.server.app import close_in_worker, create_app, open_in_worker
from tests.test_admission import EchoBackend

env = {"ONNXPOOL_METRICS__ENABLED": "false", "ONNXPOOL_TRACING__FLUSH_TIMEOUT_SECONDS": "0.2"}
if sys.argv[1] == "on":
    env["ONNXPOOL_TRACING__ENDPOINT"] = "http://127.0.0.1:%d"
app = create_app(load_settings(environ=env).settings, EchoBackend())
planned = [m for m in sys.modules if m.startswith("opentelemetry")]
open_in_worker(app, 1)  # what post_fork does
body = {"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
reply = app.test_client().post("/v2/models/efficientnet-lite0/infer", json=body)
close_in_worker(app)  # what worker_exit does
loaded = [m for m in sys.modules if m.startswith("opentelemetry")]
print(reply.status_code, reply.headers.get("traceparent") is not None, len(planned), len(loaded))
"""


@pytest.mark.parametrize("tracing", ["off", "on"])
def test_with_tracing_off_no_opentelemetry_module_is_ever_imported(tracing: str) -> None:
    script = OFF_OR_ON % free_port()
    run = subprocess.run(
        [sys.executable, "-c", script, tracing], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    status, traced, planned, loaded = run.stdout.split()
    assert status == "200" and planned == "0"  # the master's part (the app, the plan) never imports it
    if tracing == "off":
        assert (traced, loaded) == ("False", "0"), run.stderr
    else:  # the control: the same path with tracing on does load it, in the "worker"
        assert traced == "True" and int(loaded) > 10, run.stderr


def test_the_workers_export_without_grpc() -> None:
    """OTLP over HTTP/protobuf: the exporter never loads grpcio (a C extension with threads of its own)."""
    script = "import sys, onnxpool.server.tracing_export; print(any(m.startswith('grpc') for m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", script], cwd=Path(REPO), capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"
