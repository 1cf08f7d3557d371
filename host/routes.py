"""The host's routes: what a host serving several models answers for all of them, from one process.

nginx sends here every request that names no model the host routes to a pool (host/front_door.py).
One owner, so every request gets the same answer, read from the host's files: host.json (each
model's state, written by the host process as it watches the pools) and each pool's description
(its routes and OpenAPI document, written by its master). No request is sent to a pool.

- GET /v2/health/live: 200 while this process runs.
- GET /v2/health/ready: 200 when every model the host's readiness waits for is READY (each one not
  `optional` that the host started with, and a hot-added one once it has been ready), else 503
  naming those that are not.
- GET /v2/models, POST /v2/repository/index: every model with its state and, when not ready, why.
- GET /v1/models: OpenAI's model list: every model and alias.
- /v2/models/<name>..., /v1/models/<name>... of a model the host does not route: 404 naming every
  model, or 503 with the state's reason for a model that is not serving.
- GET /metrics: every pool's series, each labelled with its model, and the host's own (each model's
  state, its pool's restarts), in one scrape.
- GET /openapi.json and /docs: every model's routes, each under its model's name.

Run by gunicorn (one worker, a few threads) under the host's supervisord: `create_app()` reads
$ONNXPOOL_HOST_DIR and $ONNXPOOL_CONFIG; a reload HUPs it, and the new worker reads the file anew.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from flask import Flask, Response, request
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from werkzeug.exceptions import HTTPException

from onnxpool import __version__
from onnxpool.config.callers import caller_book_of
from onnxpool.config.loader import ENV_CONFIG_FILE, ENV_HOST_DIR, ConfigError, load_settings
from onnxpool.config.settings import Settings
from onnxpool.host.state import HostModel, metrics_folders, read_pool_description
from onnxpool.host.view import HostView, not_ready, unavailable
from onnxpool.server import auth, metrics, routes_docs
from onnxpool.server.context import error_response, json_response
from onnxpool.server.model_states import model_list, repository_index
from onnxpool.tasks.errors import OnnxpoolError

HOST_TAG = "host"


def openai_models(models: tuple[HostModel, ...]) -> dict[str, object]:
    """OpenAI's `GET /v1/models`: every model and alias, as the `openai` client's models.list() reads it."""
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "onnxpool"}
            for model in models
            for name in (model.name, *model.aliases)
        ],
    }


def merged_openapi(view: HostView, auth_on: bool) -> dict[str, Any]:
    """One OpenAPI document from each model's (as its pool wrote it): a route of one model is written
    under its name (`/v2/models/iris/infer`), tagged with it; a route several models' tasks share
    (`/predict`) is the first model's, as nginx routes it; the host's own routes (health, model lists,
    metrics) are tagged `host`."""
    models = view.models()
    document: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {
            "title": "onnxpool",
            "version": __version__,
            "description": "Serves the ONNX models "
            + ", ".join(model.name for model in models)
            + " on CPUs behind one front door: each model's task routes and Open Inference Protocol v2 "
            "REST under its name, the host's health, model lists and Prometheus metrics.",
        },
        "paths": {},
        "components": {"schemas": {}},
        "tags": [{"name": HOST_TAG, "description": "the host's own routes, for every model"}],
    }
    paths: dict[str, Any] = document["paths"]
    for model in models:
        description = view_description(view, model.name)
        if description is None:
            continue
        reason = f": {model.reason}" if model.reason else ""
        document["tags"].append({"name": model.name, "description": f"model {model.name} ({model.state}{reason})"})
        for path, operations in description.get("paths", {}).items():
            own = MODEL_PARAMETER in path
            concrete = path.replace(MODEL_PARAMETER, model.name)
            if concrete in paths:
                continue
            paths[concrete] = _for_model(operations, model.name if own or not _host_path(path) else "", own)
        for name, schema in description.get("components", {}).get("schemas", {}).items():
            document["components"]["schemas"].setdefault(name, schema)
        schemes = description.get("components", {}).get("securitySchemes")
        if schemes:
            document["components"]["securitySchemes"] = schemes
    if auth_on:
        document["security"] = [{"bearerAuth": []}]
    return document


MODEL_PARAMETER = "{model}"


def _for_model(operations: dict[str, Any], model: str, own: bool) -> dict[str, Any]:
    """A path's operations tagged with their model (or `host`); a model's own path loses its `model`
    parameter (the name is in the path) and its operation ids get the model's name (ids are unique)."""
    tagged = copy.deepcopy(operations)
    for operation in tagged.values():
        if not isinstance(operation, dict):
            continue
        operation["tags"] = [model or HOST_TAG]
        if own:
            operation["parameters"] = [
                parameter
                for parameter in operation.get("parameters", [])
                if not (parameter.get("in") == "path" and parameter.get("name") == "model")
            ]
            if "operationId" in operation:
                operation["operationId"] = f"{operation['operationId']}_{model}"
    return tagged


def _host_path(path: str) -> bool:
    return path.startswith(("/v2/health", "/metrics", "/openapi.json", "/docs")) or path in (
        "/v2/models",
        "/v2/repository/index",
        "/v2",
    )


def view_description(view: HostView, name: str) -> dict[str, Any] | None:
    found = read_pool_description(view.run_dir, name)
    return found.openapi if found is not None else None


class HostSeries:
    """The host's own series: each model's state and its pool's restarts (prometheus_client collector)."""

    def __init__(self, view: HostView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        reading = self.view.state().reading
        yield GaugeMetricFamily(
            "onnxpool_host_settings_applied",
            "1 if the host applied its settings file at its last reading (start or HUP), 0 if it refused it",
            value=1.0 if reading.applied else 0.0,
        )
        yield GaugeMetricFamily(
            "onnxpool_host_settings_read_timestamp_seconds",
            "When the host last read its settings file (Unix time), applied or refused",
            value=reading.time,
        )
        state = GaugeMetricFamily(
            "onnxpool_model_state", "1 for the state each model of the host is in", labels=["model", "state"]
        )
        restarts = CounterMetricFamily(
            "onnxpool_model_pool_restarts", "Times the host's supervisor restarted a model's pool", labels=["model"]
        )
        for model in self.view.models():
            for name in ("READY", "LOADING", "UNAVAILABLE"):
                state.add_metric([model.name, name], 1.0 if model.state == name else 0.0)
            restarts.add_metric([model.name], float(max(0, model.starts - 1)))
        yield state
        yield restarts


_read: Settings | None = None
"""The settings the routes' master read last (`read_settings`); its workers are forked with them."""


def read_settings() -> Settings:
    """Master, at start and at each HUP (host/routes_conf.py): $ONNXPOOL_CONFIG's settings. A file that no
    longer loads (edited again since the host's HUP, say) is one line, and the routes keep what they had:
    they never stop answering the probes over it."""
    global _read
    try:
        _read = load_settings(Path(os.environ[ENV_CONFIG_FILE]), pool="").settings
    except ConfigError as exc:
        if _read is None:
            raise
        logging.getLogger("onnxpool.host").error("reload: the host's routes keep their settings: %s", exc)
    return _read


def _drain() -> None:
    """Read the request's body to its end before answering without it (a model this host does not serve, or
    no longer: a removed model's infer). Closed unread, nginx may still be sending it: its write fails
    (EPIPE) and the client gets nginx's 503 instead of this answer. nginx bounds the body (max_body_bytes)."""
    stream = request.stream
    while stream.read(1 << 16):
        pass


def create_app(run_dir: Path | None = None, settings: Settings | None = None) -> Flask:
    """The host's routes over `run_dir` (default $ONNXPOOL_HOST_DIR) with the host's settings (default: those
    its master read, else $ONNXPOOL_CONFIG's): [auth] keys guard every route but the probes, /openapi.json
    and /docs."""
    if run_dir is None:
        run_dir = Path(os.environ[ENV_HOST_DIR])
    if settings is None:
        settings = _read or load_settings(Path(os.environ[ENV_CONFIG_FILE]), pool="").settings
    view = HostView(run_dir)
    app = Flask(__name__)
    auth_on = auth.install(app, caller_book_of(settings), settings.auth.protect_metrics)
    series = HostSeries(view)

    @app.errorhandler(OnnxpoolError)
    def _refused(exc: OnnxpoolError) -> Response:
        return error_response(exc.message, exc.status, exc.headers or None)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> Response:
        _drain()
        if exc.code == 405:
            return error_response(f"method {request.method} is not allowed on {request.path}", 405)
        if exc.code == 404:
            return error_response(f"no route {request.path}", 404)
        return error_response(exc.description or exc.name, exc.code or 500)

    @app.get("/v2/health/live")
    def live() -> Response:
        return json_response({"live": True})

    @app.get("/v2/health/ready")
    def ready() -> Response:
        waiting = not_ready(view.models())
        document: dict[str, object] = {"ready": not waiting}
        if waiting:
            document["not_ready"] = waiting
        return json_response(document, 503 if waiting else 200)

    @app.get("/v2/models")
    def models() -> Response:
        state = view.state()
        return json_response({**model_list(state.models), "settings_file": asdict(state.reading)})

    @app.post("/v2/repository/index")
    def index() -> Response:
        return json_response(repository_index(view.models(), request.get_data(cache=False)))

    @app.get("/v1/models")
    def openai_list() -> Response:
        return json_response(openai_models(view.models()))

    @app.route("/v2/models/<name>", methods=["GET", "POST"])
    @app.route("/v2/models/<name>/<path:rest>", methods=["GET", "POST"])
    @app.route("/v1/models/<name>", methods=["GET", "POST"])
    @app.route("/v1/models/<name>/<path:rest>", methods=["GET", "POST"])
    def model_route(name: str, rest: str = "") -> Response:
        _drain()
        name = name.partition(":")[0]  # KServe v1: /v1/models/<name>:predict
        model = view.find(name)
        if model is None:
            return error_response(view.unknown(name), 404)
        return error_response(unavailable(model), 503, {"Retry-After": "1"})

    if settings.metrics.enabled:

        @app.get(auth.METRICS_PATH)
        def scrape() -> Response:
            names = {model.name for model in view.models()}
            folders = {name: path for name, path in metrics_folders(run_dir).items() if name in names}
            body, content_type = metrics.render(folders, extra=[series])
            return Response(body, content_type=content_type)

    @app.get("/openapi.json")
    def openapi() -> Response:
        return json_response(merged_openapi(view, auth_on))

    routes_docs.install(app, settings.server.docs)
    return app
