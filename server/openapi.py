"""The HTTP API described in OpenAPI 3.0, served at `GET /openapi.json`.

`openapi_document(settings, task)` builds a plain dict (no I/O) from the routes and each task
route's own fragment (`Task.openapi`); the configured model
name and version are the only values the `{model}` / `{version}` path
parameters accept, as the server itself answers 404 for any other.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app

from onnxpool import __version__
from onnxpool.config.settings import Settings
from onnxpool.server.auth import AUTH_KEY
from onnxpool.server.context import context, json_response
from onnxpool.server.datatypes import V2_TO_NUMPY
from onnxpool.tasks.api import Task
from onnxpool.tasks.server_routes import OPENAPI

AnyTask = Task[Any, Any, Any]

blueprint = Blueprint("openapi", __name__)

Schema = dict[str, Any]

ERROR_STATUSES = {
    "400": "Malformed request, or it does not match the model (shape, datatype, names).",
    "401": "Missing or invalid API key (only when [auth] keys are configured).",
    "404": "Unknown model or version.",
    "413": "Body, batch, tensor or image larger than the configured limits.",
    "415": "Content-Type or image format the endpoint cannot read.",
    "422": "Well-formed but unusable content, e.g. a truncated image.",
    "503": "Model not loaded yet, or the request was shed (waited past its budget); see Retry-After.",
}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


def _error(status: str) -> Schema:
    reply: Schema = {"description": ERROR_STATUSES[status], "content": _json(_ref("Error"))}
    if status == "503":
        reply["headers"] = {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer"}}}
    if status == "401":
        reply["headers"] = {"WWW-Authenticate": {"description": "Bearer challenge", "schema": {"type": "string"}}}
    return reply


def _errors(*statuses: str, auth: bool) -> dict[str, Schema]:
    wanted = ("401", *statuses) if auth else statuses
    return {s: _error(s) for s in sorted(set(wanted))}


def _model_state(**fields: Schema) -> Schema:
    """One model of the host (GET /v2/models, Triton's repository index): its name, state, why, and `fields`."""
    return {
        "type": "object",
        "required": ["name", *fields, "state"],
        "properties": {
            "name": {"type": "string"},
            **fields,
            "state": {"type": "string", "enum": ["READY", "LOADING", "UNAVAILABLE"]},
            "reason": {"type": "string"},
        },
    }


def _schemas() -> dict[str, Schema]:
    datatype = {"type": "string", "enum": list(V2_TO_NUMPY)}
    shape = {"type": "array", "items": {"type": "integer", "minimum": 0}}
    params = {"type": "object", "additionalProperties": True}
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "string", "description": "What went wrong, for a developer."}},
        },
        "ServerMetadata": {
            "type": "object",
            "required": ["name", "version", "extensions"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
            },
        },
        "Live": {"type": "object", "required": ["live"], "properties": {"live": {"type": "boolean"}}},
        "Ready": {
            "type": "object",
            "required": ["ready"],
            "properties": {
                "ready": {"type": "boolean"},
                "not_ready": {"type": "array", "items": {"type": "string"}},
            },
        },
        "ModelList": {
            "type": "object",
            "required": ["models"],
            "properties": {
                "models": {
                    "type": "array",
                    "items": _model_state(
                        versions={"type": "array", "items": {"type": "string"}},
                        aliases={"type": "array", "items": {"type": "string"}},
                    ),
                }
            },
        },
        "RepositoryIndex": {"type": "array", "items": _model_state(version={"type": "string"})},
        "ModelReady": {
            "type": "object",
            "required": ["name", "ready"],
            "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}},
        },
        "TensorMetadata": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "properties": {
                "name": {"type": "string"},
                "datatype": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer", "minimum": -1}},
            },
        },
        "ModelMetadata": {
            "type": "object",
            "required": ["name", "versions", "platform", "inputs", "outputs"],
            "properties": {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": _ref("TensorMetadata")},
                "outputs": {"type": "array", "items": _ref("TensorMetadata")},
            },
        },
        "RequestInput": {
            "type": "object",
            "required": ["name", "shape", "datatype"],
            "properties": {
                "name": {"type": "string"},
                "shape": shape,
                "datatype": datatype,
                "parameters": {
                    "type": "object",
                    "properties": {"binary_data_size": {"type": "integer", "minimum": 0}},
                },
                "data": {
                    "type": "array",
                    "description": "Row-major values, flat or nested; null reads as NaN for FP types. "
                    "Omitted when parameters.binary_data_size is given.",
                    "items": {},
                },
            },
        },
        "RequestOutput": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "parameters": {"type": "object", "properties": {"binary_data": {"type": "boolean"}}},
            },
        },
        "InferRequest": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": {"type": "string"},
                "parameters": {
                    "type": "object",
                    "properties": {
                        "binary_data_output": {"type": "boolean"},
                        "timeout": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "Microseconds; shed (503) if the request waited longer (X-Request-Start).",
                        },
                    },
                },
                "inputs": {"type": "array", "minItems": 1, "items": _ref("RequestInput")},
                "outputs": {"type": "array", "items": _ref("RequestOutput")},
            },
        },
        "ResponseOutput": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "properties": {
                "name": {"type": "string"},
                "datatype": datatype,
                "shape": shape,
                "parameters": params,
                "data": {
                    "type": "array",
                    "description": "Flat, row-major. FP16 is written as FP32 numbers; NaN and ±inf as null.",
                    "items": {},
                },
            },
        },
        "InferResponse": {
            "type": "object",
            "required": ["model_name", "outputs"],
            "properties": {
                "model_name": {"type": "string"},
                "model_version": {"type": "string"},
                "id": {"type": "string"},
                "outputs": {"type": "array", "items": _ref("ResponseOutput")},
            },
        },
    }


def _deadline_headers() -> list[Schema]:
    return [
        {
            "name": "X-Request-Start",
            "in": "header",
            "required": False,
            "description": "When the request started (nginx: t=${msec}): t=<unix seconds>, or integer ms/µs.",
            "schema": {"type": "string"},
        },
        {
            "name": "X-Request-Timeout",
            "in": "header",
            "required": False,
            "description": "Client deadline in seconds: shed (503) if the request waited longer.",
            "schema": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
        },
    ]


def _cache_control_header() -> Schema:
    return {
        "name": "Cache-Control",
        "in": "header",
        "required": False,
        "description": "Response cache ([cache] settings): no-cache computes the reply and refreshes "
        "the stored one; no-store neither reads nor stores it.",
        "schema": {"type": "string"},
    }


# On every reply of a cached route (the key covers the model, its settings and the request).
X_CACHE: Schema = {
    "X-Cache": {
        "description": "HIT: replayed from the response cache, byte for byte; MISS: computed.",
        "schema": {"type": "string", "enum": ["HIT", "MISS"]},
    }
}


def _model_ready_responses(auth: bool) -> dict[str, Schema]:
    return {
        "200": {"description": "Ready", "content": _json(_ref("ModelReady"))},
        "503": {
            "description": "Not loaded yet (ModelReady), or shed (Error)",
            "content": _json({"anyOf": [_ref("ModelReady"), _ref("Error")]}),
        },
    } | _errors("404", auth=auth)


def _model_params(settings: Settings, version: bool) -> list[Schema]:
    params: list[Schema] = [
        {
            "name": "model",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "enum": [settings.model.name], "default": settings.model.name},
        }
    ]
    if version:
        params.append(
            {
                "name": "version",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "enum": [settings.model.version], "default": settings.model.version},
            }
        )
    return params


def _paths(settings: Settings, task: AnyTask, auth: bool) -> dict[str, Schema]:
    open_security: dict[str, Any] = {"security": []} if auth else {}
    paths: dict[str, Schema] = {
        "/v2": {
            "get": {
                "operationId": "serverMetadata",
                "summary": "Server name, version and protocol extensions",
                "responses": {"200": {"description": "Metadata", "content": _json(_ref("ServerMetadata"))}}
                | _errors("503", auth=auth),
            }
        },
        "/v2/health/live": {
            "get": {
                "operationId": "serverLive",
                "summary": "Liveness probe (never needs a key, never shed)",
                **open_security,
                "responses": {"200": {"description": "Alive", "content": _json(_ref("Live"))}},
            }
        },
        "/v2/health/ready": {
            "get": {
                "operationId": "serverReady",
                "summary": "Readiness probe: 200 once the model is loaded and warmed up (on a host serving "
                "several models: once every model is; `not_ready` names the others)",
                **open_security,
                "responses": {
                    "200": {"description": "Ready", "content": _json(_ref("Ready"))},
                    "503": {"description": "Not ready yet", "content": _json(_ref("Ready"))},
                },
            }
        },
        "/v2/models": {
            "get": {
                "operationId": "modelList",
                "summary": "The models served here (every model of the host), their versions, aliases and state",
                "responses": {"200": {"description": "Models", "content": _json(_ref("ModelList"))}}
                | _errors(auth=auth),
            }
        },
        "/v2/repository/index": {
            "post": {
                "operationId": "repositoryIndex",
                "summary": "Triton's model repository index: every model with its state; "
                '`{"ready": true}` lists only the ready ones',
                "requestBody": {
                    "required": False,
                    "content": _json({"type": "object", "properties": {"ready": {"type": "boolean"}}}),
                },
                "responses": {"200": {"description": "Index", "content": _json(_ref("RepositoryIndex"))}}
                | _errors("400", auth=auth),
            }
        },
    }
    for version in (False, True):
        base = "/v2/models/{model}" + ("/versions/{version}" if version else "")
        suffix = "Version" if version else ""
        params = _model_params(settings, version)
        paths[base] = {
            "get": {
                "operationId": "modelMetadata" + suffix,
                "summary": "The model's inputs and outputs",
                "parameters": params,
                "responses": {"200": {"description": "Metadata", "content": _json(_ref("ModelMetadata"))}}
                | _errors("404", "503", auth=auth),
            }
        }
        paths[base + "/ready"] = {
            "get": {
                "operationId": "modelReady" + suffix,
                "summary": "Whether the model can serve",
                "parameters": params,
                "responses": _model_ready_responses(auth),
            }
        }
        paths[base + "/infer"] = {"post": _infer_operation(params, suffix, auth)}
    for rule in task.routes:
        path, params = _openapi_path(rule, settings)
        paths[path] = {"post": _task_operation(task, rule, params, auth)}
    paths["/v1/models"] = {
        "get": {
            "operationId": "v1ListModels",
            "summary": "KServe v1: the models this server serves",
            "responses": {
                "200": {
                    "description": "Model names",
                    "content": _json(
                        {
                            "type": "object",
                            "required": ["models"],
                            "properties": {"models": {"type": "array", "items": {"type": "string"}}},
                        }
                    ),
                }
            }
            | _errors("503", auth=auth),
        }
    }
    paths["/v1/models/{model}"] = {
        "get": {
            "operationId": "v1ModelStatus",
            "summary": "KServe v1: whether the model can serve",
            "parameters": _model_params(settings, False),
            "responses": _model_ready_responses(auth),
        }
    }
    metrics_security = {} if settings.auth.protect_metrics else open_security
    paths["/metrics"] = {
        "get": {
            "operationId": "metrics",
            "summary": "Prometheus metrics, aggregated over all workers",
            **metrics_security,
            "responses": {
                "200": {
                    "description": "Prometheus text format",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            }
            | (_errors(auth=auth) if settings.auth.protect_metrics else {}),
        }
    }
    paths["/openapi.json"] = {
        "get": {
            "operationId": "openapi",
            "summary": "This document",
            **open_security,
            "responses": {"200": {"description": "OpenAPI 3.0", "content": _json({"type": "object"})}},
        }
    }
    return paths


def _infer_operation(params: list[Schema], suffix: str, auth: bool) -> Schema:
    binary_header: Schema = {
        "name": "Inference-Header-Content-Length",
        "in": "header",
        "required": False,
        "description": "Binary tensor extension: length of the JSON header at the start of the body.",
        "schema": {"type": "integer", "minimum": 0},
    }
    return {
        "operationId": "modelInfer" + suffix,
        "summary": "Run the model (Open Inference Protocol v2, JSON or binary tensors)",
        "parameters": [*params, binary_header, *_deadline_headers(), _cache_control_header()],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": _ref("InferRequest")},
                "application/octet-stream": {
                    "schema": {
                        "type": "string",
                        "format": "binary",
                        "description": "JSON InferRequest header (Inference-Header-Content-Length bytes), then "
                        "the raw little-endian tensors of inputs with parameters.binary_data_size, in order.",
                    }
                },
            },
        },
        "responses": {
            "200": {
                "description": "Outputs; binary outputs follow the JSON header",
                "headers": {
                    "Inference-Header-Content-Length": {
                        "description": "Length of the JSON header when binary outputs follow",
                        "schema": {"type": "integer"},
                    }
                }
                | X_CACHE,
                "content": {
                    "application/json": {"schema": _ref("InferResponse")},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                },
            }
        }
        | _errors("400", "404", "413", "503", auth=auth),
    }


def _openapi_path(rule: str, settings: Settings) -> tuple[str, list[Schema]]:
    """A werkzeug rule as an OpenAPI path, and its path parameters (only `<model>` is allowed)."""
    if "<model>" not in rule:
        return rule, []
    return rule.replace("<model>", "{model}"), _model_params(settings, False)


def _operation_id(rule: str) -> str:
    # The protocol version stays in a per-model rule's id: tabular serves both /predict and
    # /v1/models/<model>:predict, and /docs' links and try-it-out need the two ids distinct.
    keep_version = "<model>" in rule
    words = [
        w
        for w in rule.replace("<model>", "").replace(":", "/").split("/")
        if w and (keep_version or w not in ("v1", "v2"))
    ]
    return "task" + "".join(w[:1].upper() + w[1:] for w in words if w != "models")


def _task_operation(task: AnyTask, rule: str, params: list[Schema], auth: bool) -> Schema:
    """The task's fragment for `rule`, inside what every task route has (model, deadlines, cache, errors)."""
    fragment = task.openapi(rule)
    responses: dict[str, Schema] = dict(fragment.get("responses", {}))
    ok = dict(responses.get("200", {"description": "The task's reply"}))
    ok["headers"] = {**ok.get("headers", {}), **X_CACHE}
    responses["200"] = ok
    return {
        "operationId": _operation_id(rule),
        **{k: v for k, v in fragment.items() if k not in ("responses", "parameters")},
        "parameters": [*params, *fragment.get("parameters", []), *_deadline_headers(), _cache_control_header()],
        "responses": responses | _errors("400", "404", "413", "415", "422", "503", auth=auth),
    }


def openapi_document(settings: Settings, task: AnyTask, auth: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.0 description of this server's API for its configured model and task."""
    document: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {
            "title": "onnxpool",
            "version": __version__,
            "description": f"Serves the ONNX model {settings.model.name} on CPUs: its task's routes "
            f"({task.name}), Open Inference Protocol v2 REST, Prometheus metrics. Errors are JSON "
            '{"error": message}, or in the shape of the API a task speaks (OpenAI error objects for embeddings).',
        },
        "paths": _paths(settings, task, auth),
        "components": {"schemas": _schemas()},
    }
    if auth:
        document["components"]["securitySchemes"] = {
            "bearerAuth": {
                "type": "http",
                "scheme": "bearer",
                "description": "One of the server's API keys ([auth]), sent as `Authorization: Bearer <key>`.",
            }
        }
        document["security"] = [{"bearerAuth": []}]
    return document


@blueprint.get(OPENAPI)
def openapi_json() -> Response:
    auth_on = AUTH_KEY in current_app.extensions
    ctx = context()
    return json_response(openapi_document(ctx.settings, ctx.task, auth=auth_on))
