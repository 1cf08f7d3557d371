"""Every Prometheus metric of onnxpool, and the small functions that observe them.

Process rule: prometheus_client picks its storage when it is IMPORTED. Under
gunicorn the master exports $PROMETHEUS_MULTIPROC_DIR at config load
(`workers.metrics_dir`), before the preloaded app imports this module, so
every process (master and workers) writes its own files there and `render()`
sums them: /metrics gives the same totals whichever worker answers. Without
that variable (an app built in-process, e.g. in tests) metrics are per process.

Labels stay bounded: `endpoint` is the route template (`/v2/models/<model>/infer`,
or `<unmatched>`), never the raw path; `model` is the configured model name,
`<unknown>` for a URL naming another one, or "" for routes without a model; `task`
is the served task's name (one per server); `cache` is hit, miss or none.
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Seconds: sub-millisecond phases (decode/encode of small tensors) up to slow
# batches and long queue waits.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
    0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

REQUESTS = Counter(
    "onnxpool_requests",
    "Requests answered, by model, route template, task, response cache outcome (hit: replayed, "
    "miss: computed after a look-up, none: not looked up), status code (GET /metrics excluded) and protocol "
    "(http, or grpc: a gRPC call counts under the v2 REST route it means, with the REST status it got).",
    ["model", "endpoint", "task", "cache", "status", "protocol"],
)
REQUEST_SECONDS = Histogram(
    "onnxpool_request_duration_seconds",
    "Whole request: queue wait (when X-Request-Start is sent) plus the time in the app until it replies; "
    "`cache` and `protocol` as in onnxpool_requests_total.",
    ["model", "endpoint", "cache", "protocol"],
    buckets=LATENCY_BUCKETS,
)
CALLER_REQUESTS = Counter(
    "onnxpool_caller_requests",
    "Requests answered by the workers, by caller (config/callers.py; `anonymous`: no known caller), model "
    "and status (403: a model it may not use, 503: shed). Only when callers are told apart.",
    ["caller", "model", "status"],
)
CALLER_REQUEST_SECONDS = Histogram(
    "onnxpool_caller_request_duration_seconds",
    "Whole request (queue wait included, as onnxpool_request_duration_seconds), by caller and model.",
    ["caller", "model"],
    buckets=LATENCY_BUCKETS,
)
PHASE_SECONDS = Histogram(
    "onnxpool_request_phase_seconds",
    "Time per request phase: queue (X-Request-Start to worker), decode (parse/preprocess), infer, encode.",
    ["model", "endpoint", "phase"],
    buckets=LATENCY_BUCKETS,
)
BATCH_SIZE = Histogram(
    "onnxpool_inference_batch_size",
    "Batch size of each inference (first dimension of the first input).",
    ["model"],
    buckets=BATCH_BUCKETS,
)
WIDE_RUNS = Counter(
    "onnxpool_wide_runs",
    "Inferences that ran wide: on the model's idle workers' cores too ([model] wide_threads); compare with "
    "the count of onnxpool_inference_batch_size (every inference).",
    ["model"],
)
IN_FLIGHT = Gauge(
    "onnxpool_requests_in_flight",
    "Requests being served right now, over all live workers.",
    multiprocess_mode="livesum",
)
WORKER_RESTARTS = Counter(
    "onnxpool_worker_restarts",
    "Worker processes that exited and were replaced (crash, kill, timeout, max_requests recycle, reload).",
)
MODEL_LOAD_SECONDS = Gauge(
    "onnxpool_model_load_seconds",
    "Seconds the live worker in each slot took to build its onnxruntime session.",
    ["slot"],
    multiprocess_mode="livesum",
)
WARMUP_SECONDS = Gauge(
    "onnxpool_model_warmup_seconds",
    "Seconds the live worker in each slot spent on warm-up inferences.",
    ["slot"],
    multiprocess_mode="livesum",
)
WORKER_MEMORY = Gauge(
    "onnxpool_worker_memory_bytes",
    "Memory of each live worker (label pid) from /proc/<pid>/smaps_rollup, by model and kind: private "
    "(Private_Clean + Private_Dirty: what this worker alone holds) or pss (its proportional share of "
    "the pages it shares, such as the mapped model copy; the workers' pss sum to what they hold). "
    "Set after warm-up, then at most every few seconds after a request or a scrape.",
    ["model", "kind"],
    multiprocess_mode="liveall",
)
BUILD_INFO = Gauge(
    "onnxpool_build_info",
    "Always 1: onnxpool and onnxruntime versions, worker count and threads per worker.",
    ["version", "onnxruntime_version", "workers", "threads_per_worker"],
    multiprocess_mode="max",  # set by the master only
)
MODEL_CPU_FIT = Gauge(
    "onnxpool_model_cpu_fit",
    "Always 1: the served model's INT8 target (onnxpool quantize --target; empty for other models) and "
    "whether this CPU fits it: ok, no-vnni (made for VNNI, this CPU lacks it), not-onnxpool.",
    ["model", "target", "cpu_fit"],
    multiprocess_mode="max",  # set by the master only
)
CACHE_BUCKETS = (0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.0025, 0.01, 0.05, 0.1, 0.25)
CACHE_EVENTS = Counter(
    "onnxpool_cache_events",
    "Response cache events by backend (local, redis): hit, miss, store, evict (entries evicted for room), "
    "expire (entries purged after their TTL), skip (not stored: error status or too large), "
    "error (backend failure or corrupt entry; the request is computed instead).",
    ["backend", "event"],
)
CACHE_LOOKUP_SECONDS = Histogram(
    "onnxpool_cache_lookup_seconds",
    "Time of one response cache lookup (hit or miss), by backend.",
    ["backend"],
    buckets=CACHE_BUCKETS,
)
CACHE_BYTES = Gauge(
    "onnxpool_cache_bytes",
    "Bytes held by the local response cache (shared by all workers of the host; as last seen by any worker).",
    ["backend"],
    multiprocess_mode="mostrecent",
)
TRACE_SPANS = Counter(
    "onnxpool_trace_spans",
    "Spans of sampled requests ([tracing]) by outcome: exported (the collector took them), export_failed "
    "(the collector refused them, was unreachable or too slow: dropped), queue_full (a worker's span queue "
    "was full while the collector lagged: dropped). Only with tracing on.",
    ["outcome"],
)
TRACE_OUTCOMES = ("exported", "export_failed", "queue_full")
INFERENCE_LOG_EVENTS = Counter(
    "onnxpool_inference_log_events",
    "Inference log events ([inference_log]; files: one record per request) by model and outcome: sent (the "
    "sink took it, or it was written), dropped (the worker's buffer was full, or it was still held when the "
    "worker left), failed (the sink refused it or could not be reached, after its retries).",
    ["model", "outcome"],
)
INFERENCE_LOG_OUTCOMES = ("sent", "dropped", "failed")
INFERENCE_LOG_QUEUE_BYTES = Gauge(
    "onnxpool_inference_log_queue_bytes",
    "Bytes of inference log events waiting in the workers' buffers (summed over live workers; each at most "
    "[inference_log] max_bytes).",
    ["model"],
    multiprocess_mode="livesum",
)
INFERENCE_LOG_DELIVERY_SECONDS = Histogram(
    "onnxpool_inference_log_delivery_seconds",
    "From an inference log event's reply to the sink taking it (or the file write), by model.",
    ["model"],
    buckets=LATENCY_BUCKETS,
)


@functools.lru_cache(maxsize=4096)
def _child(metric: Any, labels: tuple[str, ...]) -> Any:
    """A metric's child for these label values, found once per process: `labels()` checks
    every value and takes a lock on each call, a hit's whole store read in cost. Labels
    are bounded (see above), so the cache is too."""
    return metric.labels(*labels)


def observe_cache_event(name: str, backend: str, value: float) -> None:
    """The response cache's `on_event` hook: counters by backend, lookup time as a histogram."""
    if name == "lookup":
        _child(CACHE_LOOKUP_SECONDS, (backend,)).observe(value)
    else:
        _child(CACHE_EVENTS, (backend, name)).inc(value)


# Every event onnxpool_cache_events_total counts (onnxpool.cache.policy.EventHook but "lookup").
CACHE_EVENT_NAMES = ("hit", "miss", "store", "evict", "expire", "skip", "error")


def cache_opened(backend: str) -> None:
    """In a worker whose cache opened: every event's series at 0, so that rate() and increase()
    (alerts on `event="error"`) see the first one; a series born at 1 shows no increase."""
    for name in CACHE_EVENT_NAMES:
        _child(CACHE_EVENTS, (backend, name))


def cache_bytes(backend: str, used: int) -> None:
    CACHE_BYTES.labels(backend).set(used)


def observe_request(
    model: str,
    endpoint: str,
    task: str,
    cache: str,
    status: int,
    total: float,
    phases: Mapping[str, float],
    protocol: str = "http",
) -> None:
    """Count one answered request and record its total and per-phase seconds."""
    _child(REQUESTS, (model, endpoint, task, cache, str(status), protocol)).inc()
    _child(REQUEST_SECONDS, (model, endpoint, cache, protocol)).observe(total)
    for name, seconds in phases.items():
        _child(PHASE_SECONDS, (model, endpoint, name)).observe(seconds)


def observe_caller(caller: str, model: str, status: int, total: float) -> None:
    """The same request, counted for its caller."""
    _child(CALLER_REQUESTS, (caller, model, str(status))).inc()
    _child(CALLER_REQUEST_SECONDS, (caller, model)).observe(total)


def tracing_opened() -> None:
    """In a worker whose tracing started: every outcome's series at 0 (so that increase() sees the first)."""
    for outcome in TRACE_OUTCOMES:
        _child(TRACE_SPANS, (outcome,))


def observe_spans(outcome: str, count: int) -> None:
    """Spans exported or dropped (TRACE_OUTCOMES); called from the exporter's thread too (prometheus_client
    values are thread-safe)."""
    _child(TRACE_SPANS, (outcome,)).inc(count)


def inference_log_opened(model: str) -> None:
    """In a worker whose inference log started: every outcome's series at 0 (so that increase() sees the first)."""
    for outcome in INFERENCE_LOG_OUTCOMES:
        _child(INFERENCE_LOG_EVENTS, (model, outcome))
    _child(INFERENCE_LOG_QUEUE_BYTES, (model,)).set(0)


def observe_inference_log(model: str, outcome: str, count: int = 1) -> None:
    """Events sent, dropped or failed (called from the shipper's thread too: values are thread-safe)."""
    _child(INFERENCE_LOG_EVENTS, (model, outcome)).inc(count)


def inference_log_queue(model: str, held: int) -> None:
    _child(INFERENCE_LOG_QUEUE_BYTES, (model,)).set(held)


def inference_log_delivered(model: str, seconds: float) -> None:
    _child(INFERENCE_LOG_DELIVERY_SECONDS, (model,)).observe(seconds)


def observe_batch(model: str, batch: int) -> None:
    BATCH_SIZE.labels(model).observe(batch)


def count_wide_run(model: str) -> None:
    _child(WIDE_RUNS, (model,)).inc()


def worker_loaded(slot: int, load_seconds: float, warmup_seconds: float) -> None:
    """In a worker after post_fork: how long its session build and warm-up took."""
    MODEL_LOAD_SECONDS.labels(str(slot)).set(load_seconds)
    WARMUP_SECONDS.labels(str(slot)).set(warmup_seconds)


def worker_memory(model: str, private: int, pss: int) -> None:
    """In a worker: its private and PSS bytes (workers/memory.py reads them)."""
    _child(WORKER_MEMORY, (model, "private")).set(private)
    _child(WORKER_MEMORY, (model, "pss")).set(pss)


def worker_exited(pid: int) -> None:
    """In the master when a worker is gone: drop its live gauges, count the restart.

    Its counters and histograms stay in its files, so totals never go backwards.
    """
    path = os.environ.get(MULTIPROC_ENV)
    if path:
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
    WORKER_RESTARTS.inc()


_build_labels: tuple[str, ...] | None = None


def set_build_info(version: str, onnxruntime_version: str, workers: int, threads_per_worker: int) -> None:
    """In the master: publish the build info (a changed worker count replaces the old series)."""
    global _build_labels
    labels = (version, onnxruntime_version, str(workers), str(threads_per_worker))
    if _build_labels is not None and _build_labels != labels:
        # Multiprocess files cannot drop a series; 0 marks the old one stale.
        BUILD_INFO.labels(*_build_labels).set(0)
    BUILD_INFO.labels(*labels).set(1)
    _build_labels = labels


_cpu_fit_labels: tuple[str, ...] | None = None


def set_model_cpu_fit(model: str, target: str, cpu_fit: str) -> None:
    """In the master: publish the model's target and CPU fit (a reload's new values replace the old series)."""
    global _cpu_fit_labels
    labels = (model, target, cpu_fit)
    if _cpu_fit_labels is not None and _cpu_fit_labels != labels:
        MODEL_CPU_FIT.labels(*_cpu_fit_labels).set(0)
    MODEL_CPU_FIT.labels(*labels).set(1)
    _cpu_fit_labels = labels


class _Pools:
    """A collector of several pools' multiprocess folders (one per model of a host), each pool's series
    labelled with its model: series that carry no `model` label (in-flight, restarts, cache events...)
    get their pool's, and each metric is one family over all pools."""

    def __init__(self, folders: Mapping[str, Path]) -> None:
        self.folders = folders

    def collect(self) -> Any:
        families: dict[str, Any] = {}
        for model, folder in self.folders.items():
            files = sorted(glob.glob(os.path.join(folder, "*.db")))
            for metric in multiprocess.MultiProcessCollector.merge(files, accumulate=True):  # type: ignore[no-untyped-call]
                family = families.get(metric.name)
                if family is None:
                    family = families[metric.name] = Metric(metric.name, metric.documentation, metric.type)
                for sample in metric.samples:
                    labels = sample.labels if "model" in sample.labels else {**sample.labels, "model": model}
                    family.samples.append(sample._replace(labels=labels))
        return iter(families.values())


def render(pools: Mapping[str, Path] | None = None, extra: Sequence[Collector] = ()) -> tuple[bytes, str]:
    """The exposition text (summed over all processes in multiprocess mode) and its content type.

    `pools`: the metrics folder of each model of a host that serves several, and `extra` the host's own
    series (onnxpool.host's routes): one scrape covers them all.
    """
    if pools is not None:
        registry = CollectorRegistry()
        registry.register(_Pools(pools))
        for collector in extra:
            registry.register(collector)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
