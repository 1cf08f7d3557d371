"""The inference log a generation's workers will keep (`[inference_log]`), planned in the master.

Plain data, no thread, no socket: the master reads the settings and the deployment's environment
once per generation, and each worker starts its shipper from this plan after fork
(`server.inference_log`). The CloudEvents attributes are KServe's logger's (kserve/kserve,
pkg/logger): its agent gets them as flags from the pod (`--inference-service`, `--namespace`,
`--endpoint`, `--component`, `--source-uri` = the pod's name); onnxpool reads the same facts
from the variables a pod has (`POD_NAMESPACE`, `POD_NAME` from the downward API, which
deploy/k8s sets; `HOSTNAME`, which the kubelet sets to the pod's name).
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from onnxpool.config.loader import ConfigError
from onnxpool.config.settings import Settings

NAMESPACE_ENV = "POD_NAMESPACE"
POD_NAME_ENV = "POD_NAME"
ENDPOINT_ENV = "ONNXPOOL_ENDPOINT"
DEFAULT_ENDPOINT = "default"


@dataclass(frozen=True)
class InferenceLogPlan:
    """What each worker of a generation logs, and where (see the module doc)."""

    model: str
    url: str
    path: str
    format: Literal["jsonl", "parquet"]
    mode: Literal["all", "request", "response"]
    sample: float
    headers: tuple[str, ...]
    """The request headers passed along as metadata, as the WSGI environ names them (`HTTP_X_TENANT`)."""
    header_names: tuple[str, ...]
    """The same, as configured (the metadata's keys)."""
    failures: bool
    max_bytes: int
    flush_seconds: float
    timeout_seconds: float
    retries: int
    rotate_bytes: int
    rotate_seconds: float
    tensor_elements: int
    close_seconds: float
    """How long a leaving worker may spend sending what it holds (a share of `[server] graceful_timeout`)."""
    service: str
    namespace: str
    component: str
    endpoint: str
    source: str

    @property
    def requests(self) -> bool:
        return self.mode in ("all", "request")

    @property
    def responses(self) -> bool:
        return self.mode in ("all", "response")


def environ_key(header: str) -> str:
    """A header's WSGI environ key (`X-Tenant` -> `HTTP_X_TENANT`)."""
    return "HTTP_" + header.upper().replace("-", "_")


def plan_inference_log(settings: Settings, environ: Mapping[str, str] | None = None) -> InferenceLogPlan | None:
    """The generation's inference log, or None when `[inference_log]` names no sink."""
    section = settings.inference_log
    if not section.enabled:
        return None
    # Found, not imported: pyarrow's thread pools must not start in the master (they would not cross fork).
    if section.format == "parquet" and importlib.util.find_spec("pyarrow") is None:
        raise ConfigError('inference_log.format = "parquet" needs pyarrow: pip install "onnxpool[parquet]"')
    env = os.environ if environ is None else environ
    source = section.source or env.get(POD_NAME_ENV, "") or env.get("HOSTNAME", "") or socket.gethostname()
    # Half of graceful_timeout: the rest is for the requests in flight at TERM, which come first.
    close_seconds = max(0.5, settings.server.graceful_timeout / 2)
    return InferenceLogPlan(
        model=settings.model.name,
        url=section.url,
        path=section.path,
        format=section.format,
        mode=section.mode,
        sample=section.sample,
        headers=tuple(environ_key(name) for name in section.headers),
        header_names=section.headers,
        failures=section.failures,
        max_bytes=section.max_bytes,
        flush_seconds=section.flush_seconds,
        timeout_seconds=section.timeout_seconds,
        retries=section.retries,
        rotate_bytes=section.rotate_bytes,
        rotate_seconds=section.rotate_seconds,
        tensor_elements=section.tensor_elements,
        close_seconds=close_seconds,
        service=section.service or settings.model.name,
        namespace=section.namespace or env.get(NAMESPACE_ENV, ""),
        component=section.component,
        endpoint=section.endpoint or env.get(ENDPOINT_ENV, "") or DEFAULT_ENDPOINT,
        source=source,
    )
