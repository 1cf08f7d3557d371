"""The server's own routes: the one table its blueprints register from and no task route may take.

It lives in the tasks layer, not in `onnxpool.server`, because the task check at load
(`tasks.registry.class_problem`) must read it and tasks never import the HTTP layer (the
import contracts of pyproject.toml). Rules are werkzeug's; `<model>` names the served model.

A task's own routes are not here, though clients may think of them as the server's: KServe v1
`/v1/models/<model>:predict` is the tabular task's, OpenAI's `/v1/embeddings` the text-embedding
task's (and any task speaking OpenAI's API may declare it).
"""

from __future__ import annotations

import re

V2_SERVER = "/v2"
V2_LIVE = "/v2/health/live"
V2_READY = "/v2/health/ready"
V2_MODELS = "/v2/models"
V2_REPOSITORY_INDEX = "/v2/repository/index"
V2_MODEL = "/v2/models/<model>"
V2_MODEL_VERSION = "/v2/models/<model>/versions/<version>"
V2_MODEL_READY = "/v2/models/<model>/ready"
V2_MODEL_VERSION_READY = "/v2/models/<model>/versions/<version>/ready"
V2_INFER = "/v2/models/<model>/infer"
V2_VERSION_INFER = "/v2/models/<model>/versions/<version>/infer"
V1_MODELS = "/v1/models"
V1_MODEL = "/v1/models/<model>"
METRICS = "/metrics"
OPENAPI = "/openapi.json"
DOCS = "/docs"
DOCS_SLASH = "/docs/"
DOCS_FILE = "/docs/<name>"

SERVER_ROUTES: dict[str, str] = {
    V2_SERVER: "v2 server metadata",
    V2_LIVE: "v2 liveness",
    V2_READY: "v2 readiness",
    V2_MODELS: "the model list",
    V2_REPOSITORY_INDEX: "Triton's repository index",
    V2_MODEL: "v2 model metadata",
    V2_MODEL_VERSION: "v2 model metadata",
    V2_MODEL_READY: "v2 model readiness",
    V2_MODEL_VERSION_READY: "v2 model readiness",
    V2_INFER: "v2 infer",
    V2_VERSION_INFER: "v2 infer",
    V1_MODELS: "KServe v1 model list",
    V1_MODEL: "KServe v1 model status",
    METRICS: "Prometheus metrics",
    OPENAPI: "the OpenAPI document",
    DOCS: "the API page",
    DOCS_SLASH: "the API page",
    DOCS_FILE: "the API page's files",
}
"""Every rule of the server's Flask app besides the task's, and what it answers (tests/test_task_contract.py
checks that the app has exactly these)."""

SERVER_PREFIXES: dict[str, str] = {"/v2/health": "v2 health", "/v2/repository": "Triton's model repository"}
"""Families of paths the server (or a host of several models, before any pool) answers as a whole."""

_VARIABLE = re.compile(r"<[^>]*>")


def _shape(rule: str) -> str:
    """A rule with its variables' names left out: `/v2/models/<name>/infer` and `/v2/models/<model>/infer`
    take the same paths."""
    return _VARIABLE.sub("<>", rule)


_BY_SHAPE = {_shape(rule): what for rule, what in SERVER_ROUTES.items()}


def server_route_taken(route: str) -> str:
    """What of the server's own `route` would take ("" when nothing): a rule of the same shape, or a family."""
    taken = _BY_SHAPE.get(_shape(route))
    if taken is not None:
        return taken
    return next((what for prefix, what in SERVER_PREFIXES.items() if route.startswith(prefix)), "")
