"""The task's routes: every URL in `Task.routes` runs read -> feeds -> infer -> reply.

The routes are the task's (`/predict` and `/v2/models/<model>/classify` for image
classification, `/v1/models/<model>:predict` and `/predict` for tabular...); this module
is the same for every task: it checks the model named in the URL, reads the request
through the task once (kept in the request's state), lets the response cache answer or
computes, and renders the task's reply document as JSON.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from flask import Blueprint, Response, request
from werkzeug.datastructures import MultiDict
from werkzeug.wrappers import Request

from onnxpool.server.context import ServerContext, SessionRunner, context, json_response, read_body
from onnxpool.server.request_state import RequestState, phase
from onnxpool.server.routes_v2 import check_model, loaded_model

MODEL_PART = "<model>"


class _FirstValues(Mapping[str, str]):
    """A query's first value per name; `get` without werkzeug's raise-and-catch on a missing name."""

    __slots__ = ("_args",)

    def __init__(self, args: MultiDict[str, str]) -> None:
        self._args = args

    def __getitem__(self, name: str) -> str:
        return self._args[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self._args[name] if name in self._args else default

    def __contains__(self, name: object) -> bool:
        return name in self._args

    def __iter__(self) -> Iterator[str]:
        return iter(self._args)

    def __len__(self) -> int:
        return len(self._args)


class HttpRequestParts:
    """`onnxpool.tasks.api.RequestParts` over a werkzeug request (the task never sees werkzeug)."""

    __slots__ = ("_max_body", "_request", "route")

    def __init__(self, req: Request, route: str, max_body: int) -> None:
        self._request = req
        self._max_body = max_body
        self.route = route

    @property
    def content_type(self) -> str:
        return self._request.content_type or ""

    @property
    def mimetype(self) -> str:
        # What werkzeug's `mimetype` gives, without its full parse of the parameters.
        return self.content_type.partition(";")[0].strip().lower()

    @property
    def query(self) -> Mapping[str, str]:
        return _FirstValues(self._request.args)

    def body(self) -> bytes:
        return read_body(self._request, self._max_body)


def task_paths(ctx: ServerContext) -> dict[str, str]:
    """The task's exact paths for this model, each mapped to its route rule (a metric label)."""
    name = ctx.settings.model.name
    return {rule.replace(MODEL_PART, name): rule for rule in ctx.task.routes}


def read_inputs(req: Request, ctx: ServerContext, rule: str) -> Any:
    """The task's reading of this request: made once, kept in its state (a refusal is kept too)."""
    state = RequestState.of(req.environ)
    if state.refusal is not None:
        raise state.refusal
    if state.inputs is None:
        state.inputs = ctx.task.read(HttpRequestParts(req, rule, ctx.settings.server.max_body_bytes))
    return state.inputs


def serve_task(rule: str, model: str | None) -> Response:
    """A task route: the model named in the URL, then read, look up or compute, reply."""
    ctx = context()
    if model is not None:
        check_model(model)
    info = loaded_model()
    task = ctx.task
    with phase("decode"):  # reading the request (decoding and preprocessing: on a cache miss)
        inputs = read_inputs(request, ctx, rule)

    def compute() -> Response:
        outputs = task.run(inputs, info, SessionRunner(ctx))  # feeds ("decode") and inference(s) ("infer")
        with phase("encode"):
            return json_response(task.reply(inputs, outputs))

    state = RequestState.of(request.environ)
    return ctx.cache.serve(state, task.name, lambda: task.canonical(inputs), compute)


def blueprint_for(ctx: ServerContext) -> Blueprint:
    """One POST view per route of the app's task."""
    blueprint = Blueprint("task", __name__)
    for index, rule in enumerate(ctx.task.routes):

        def view(model: str | None = None, _rule: str = rule) -> Response:
            return serve_task(_rule, model)

        blueprint.add_url_rule(rule, f"route{index}", view, methods=["POST"])
    return blueprint
