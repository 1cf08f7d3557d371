"""`GET /openapi.json`: a valid OpenAPI 3 document that covers every route, and
a property-based schemathesis run against the live server (real gunicorn).

The schemathesis run covers every operation of the document: the v2 routes,
/predict and /classify (multipart and raw image bodies), /metrics and
/openapi.json.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from openapi_spec_validator import validate

from onnxpool.config.loader import LoadedSettings, load_settings
from onnxpool.config.settings import Settings
from onnxpool.server.app import create_app
from onnxpool.server.openapi import openapi_document
from onnxpool.tasks.registry import AnyTask, build_task
from onnxpool.workers.session import SessionRuntime
from tests.harness import DEMO_MODEL_INFO, Server

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"


def _settings_and_task() -> tuple[Settings, AnyTask]:
    loaded = load_settings(environ={})
    return loaded.settings, build_task(loaded, DEMO_MODEL_INFO)


def _flask_path(rule: str) -> str:
    return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule)


@pytest.mark.parametrize("auth", [False, True])
def test_document_is_valid_openapi(auth: bool) -> None:
    document = openapi_document(*_settings_and_task(), auth=auth)
    validate(document)  # raises on any violation of the OpenAPI 3.0 schema
    assert ("securitySchemes" in document["components"]) is auth


def test_document_describes_every_route() -> None:
    settings = load_settings(environ={}).settings
    task = build_task(LoadedSettings(settings), DEMO_MODEL_INFO)
    app = create_app(settings, SessionRuntime(), task=task)
    # /docs (the page over this document and its files) is not part of the API it describes.
    api_rules = [r for r in app.url_map.iter_rules() if r.endpoint != "static" and not r.endpoint.startswith("docs.")]
    routes = {_flask_path(r.rule) for r in api_rules}
    described = set(openapi_document(settings, task)["paths"])
    assert routes <= described, routes - described
    assert {"/predict", "/v2/models/{model}/classify", "/metrics", "/openapi.json"} <= described
    model = openapi_document(settings, task)["paths"]["/v2/models/{model}"]["get"]["parameters"][0]
    assert model["schema"]["enum"] == [settings.model.name]


def test_cached_routes_document_the_cache_headers() -> None:
    paths = openapi_document(*_settings_and_task())["paths"]
    for path in ("/predict", "/v2/models/{model}/classify", "/v2/models/{model}/infer"):
        operation = paths[path]["post"]
        assert "Cache-Control" in {p["name"] for p in operation["parameters"]}, path
        assert operation["responses"]["200"]["headers"]["X-Cache"]["schema"]["enum"] == ["HIT", "MISS"], path


def test_served_document_names_the_model(server: Server) -> None:
    reply = requests.get(server.url + "/openapi.json", timeout=10)
    assert reply.status_code == 200 and reply.headers["Content-Type"] == "application/json"
    assert reply.json()["paths"]["/v2/models/{model}/infer"]["post"]["parameters"][0]["schema"]["enum"] == [
        "efficientnet-lite0"
    ]


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_schema_violation(server: Server, tmp_path: Path) -> None:
    # positive_data_acceptance is left out: a schema-valid infer body (any name, shape, data) is
    # not a valid tensor for THIS model, and the 400 saying so is the right answer.
    command = [
        str(SCHEMATHESIS),
        "run",
        server.url + "/openapi.json",
        "--checks",
        "all",
        "--exclude-checks",
        "positive_data_acceptance",
        "--max-examples",
        "25",
        "--generation-deterministic",
        "--request-timeout",
        "10",
        "--continue-on-failure",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert re.search(r"\d+ generated, \d+ passed", done.stdout), done.stdout[-2000:]
