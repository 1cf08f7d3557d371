"""The tracing a generation's workers will do (`[tracing]` and the `OTEL_*` variables), planned in the master.

Plain data and checks, no OpenTelemetry: the master validates it once per generation, with every
other setting (a bad `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` stops the start or is refused on HUP),
and each worker starts from it after fork (`server.tracing`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from onnxpool.config.loader import ConfigError
from onnxpool.config.settings import Settings, check_otlp_url

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
"""The OTLP spec's traces endpoint variable: a full URL, used as it is, when `[tracing] endpoint` is ""."""
SERVICE_ENV = "OTEL_SERVICE_NAME"
DISABLED_ENV = "OTEL_SDK_DISABLED"
TRACES_PATH = "/v1/traces"
"""Appended to `[tracing] endpoint`, the collector's base URL (OTLP/HTTP: OTEL_EXPORTER_OTLP_ENDPOINT's rule)."""
UNTRACED_PREFIXES = ("/v2/health/", "/metrics")
"""Probes and scrapes: every few seconds from every kubelet and Prometheus, and about nobody's request."""


@dataclass(frozen=True)
class TracingPlan:
    """What each worker of a generation traces with, validated in the master."""

    endpoint: str
    """The full OTLP/HTTP traces URL (`.../v1/traces`)."""
    sample_ratio: float
    service_name: str
    model: str
    task: str
    flush_timeout: float


def traces_url(base: str) -> str:
    """`[tracing] endpoint` (the collector's base URL) -> the traces URL: `/v1/traces` appended once."""
    trimmed = base.rstrip("/")
    return trimmed if trimmed.endswith(TRACES_PATH) else trimmed + TRACES_PATH


def plan_tracing(settings: Settings, task: str, environ: Mapping[str, str] | None = None) -> TracingPlan | None:
    """The generation's tracing, or None: off (no endpoint, or `OTEL_SDK_DISABLED=true`).

    Raises ConfigError (one line) for an `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` that is no URL: a
    mistake stops the start (or a HUP is refused) like a bad setting, not each worker later.
    """
    env = os.environ if environ is None else environ
    section = settings.tracing
    if env.get(DISABLED_ENV, "").strip().lower() == "true":
        return None
    if section.endpoint:
        endpoint = traces_url(section.endpoint)
    else:
        raw = env.get(ENDPOINT_ENV, "").strip()
        if not raw:
            return None
        try:
            endpoint = check_otlp_url(raw)
        except ValueError as exc:
            raise ConfigError(f"{ENDPOINT_ENV}={raw!r}: {exc} (or set [tracing] endpoint)") from None
    return TracingPlan(
        endpoint=endpoint,
        sample_ratio=section.sample_ratio,
        service_name=section.service_name or env.get(SERVICE_ENV, "").strip() or settings.model.name,
        model=settings.model.name,
        task=task,
        flush_timeout=section.flush_timeout_seconds,
    )
