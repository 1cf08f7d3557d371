"""The task's routes in Flask's URL map: what is left of them once the data plane has answered.

Every POST to one of the task's routes for THIS model is answered by the data plane
(`server.dataplane`) before Flask sees it. Flask keeps the rules so that the rest is
answered as for any route: a URL naming another model is a 404 (in the task's own error
shape), another method a 405, and the OpenAPI document lists them.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response

from onnxpool.server.context import context
from onnxpool.server.served import check_model
from onnxpool.tasks.api import Task
from onnxpool.tasks.errors import NotFound

MODEL_PART = "<model>"


def blueprint_for(task: Task[Any, Any, Any]) -> Blueprint:
    """One POST rule per route of the task."""
    blueprint = Blueprint("task", __name__)
    for index, rule in enumerate(task.routes):

        def view(model: str | None = None, _rule: str = rule) -> Response:
            ctx = context()
            check_model(ctx, model if model is not None else ctx.settings.model.name)
            # Reached only if the data plane did not take this model's own path (it always does).
            raise NotFound(f"no route {_rule}")

        blueprint.add_url_rule(rule, f"route{index}", view, methods=["POST"])
    return blueprint
