"""`GET /docs`: Swagger UI over /openapi.json, checked in a real browser.

The browser test drives Debian's `chromium` (headless, through playwright's driver; no
browser is downloaded) at the page served by the real nginx site in front of a real
gunicorn on a unix socket, as in the pod, with API keys on: the page and every file it
loads answer 200 with nothing from another origin and no console error, it lists the
routes, and a try-it-out of `/predict` with the cat photo (key entered under "Authorize")
shows the labels. `KEEP_DOCS_SCREENSHOT=docs/docs-page.png` keeps its screenshot. The JSON
examples of the KServe v1 (iris) and OpenAI embeddings (minilm) operations work as the page
fills them in.

The page's own rules (open without a key, the setting, the files it serves) are checked
on the Flask app in process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from onnxpool.config.loader import load_settings
from onnxpool.server.app import create_app
from onnxpool.server.routes_docs import CONTENT_SECURITY_POLICY, SWAGGER_UI_FILES
from onnxpool.tasks.registry import build_task
from onnxpool.workers.session import SessionRuntime
from tests.deploy_harness import Instance, Nginx, nginx_binary, start_instance, start_nginx
from tests.harness import DATA, DEMO_MODEL_INFO, REPO, running_server
from tests.k8s_render import in_ci

API_KEY = "docs-page-key-0123456789"
CAT = DATA / "chelsea-cat.jpg"
PREDICT = "#operations-default-taskPredict"


class _Client:
    """An app built in process (no model loaded: the page needs none); each reply read whole and closed."""

    def __init__(self, **env: str) -> None:
        loaded = load_settings(environ={f"ONNXPOOL_{k}": v for k, v in env.items()})
        task = build_task(loaded, DEMO_MODEL_INFO)
        self._client = create_app(loaded.settings, SessionRuntime(), task=task).test_client()

    def get(self, path: str, **kwargs: Any) -> Any:
        reply = self._client.get(path, **kwargs)
        reply.get_data()
        reply.close()  # a file reply holds its file open until closed
        return reply


def _client(**env: str) -> _Client:
    return _Client(**env)


# ------------------------------------------------------------------ in process


def test_page_and_its_files_need_no_key_while_the_api_does() -> None:
    client = _client(AUTH__API_KEYS=json.dumps([API_KEY]))
    page = client.get("/docs")
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert page.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "default-src 'none'" in CONTENT_SECURITY_POLICY and "script-src 'self'" in CONTENT_SECURITY_POLICY
    html = page.get_data(as_text=True)
    # Relative paths only: nothing from another host, and a proxy's path prefix is kept.
    assert "http" not in html.replace('lang="en"', "") and 'src="/' not in html and 'href="/' not in html
    for name in (*SWAGGER_UI_FILES, "onnxpool-docs.js"):
        reply = client.get(f"/docs/{name}")
        assert reply.status_code == 200 and len(reply.get_data()) > 100, name
    assert client.get("/v2").status_code == 401
    assert client.get("/v2", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200


def test_unknown_files_and_paths_are_json_404s() -> None:
    client = _client()
    for path in ("/docs/swagger-ui.js", "/docs/..%2fapp.py", "/docs/oauth2-redirect.html", "/docs/x/y"):
        reply = client.get(path)
        assert reply.status_code == 404 and "error" in reply.get_json(), path
    slash = client.get("/docs/")
    assert slash.status_code == 308 and slash.headers["Location"] == "../docs"


def test_setting_turns_the_page_off() -> None:
    client = _client(SERVER__DOCS="false")
    assert client.get("/docs").status_code == 404
    assert client.get("/docs/swagger-ui-bundle.js").status_code == 404
    assert client.get("/openapi.json").status_code == 200


# ------------------------------------------------------------------ in a browser


def _need(found: object, what: str) -> None:
    if not found:
        if in_ci():
            pytest.fail(f"{what} is missing: .ci/run must install it")
        pytest.skip(f"{what} is missing")


@pytest.fixture(scope="module")
def behind_nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    """nginx's rendered site in front of onnxpool on a unix socket (the pod's shape), API keys on."""
    _need(nginx_binary(), "nginx")
    tmp = tmp_path_factory.mktemp("docs")
    instance: Instance = start_instance(
        tmp, f"unix:{tmp}/onnxpool.sock", {"ONNXPOOL_AUTH__API_KEYS": json.dumps([API_KEY])}, workers=1
    )
    try:
        nginx = start_nginx(tmp, [instance.upstream])
        try:
            yield nginx
        finally:
            nginx.stop()
    finally:
        instance.stop()


@dataclass
class Watched:
    """A page in headless chromium, and what went wrong while it ran."""

    page: Any
    origin: str
    problems: list[str] = field(default_factory=list)
    requested: list[str] = field(default_factory=list)

    def open_docs(self) -> list[str]:
        """Load /docs; the paths of the operations it lists."""
        self.page.goto(self.origin + "/docs")
        self.page.wait_for_selector(".opblock-summary-path")
        return [e.inner_text() for e in self.page.query_selector_all(".opblock-summary-path")]

    def try_it_out(self, operation: str, fill: Callable[[str], None] | None = None) -> tuple[str, Any]:
        """Open an operation (its id in the document), try it out as the page fills it in (or
        `fill(selector)` does), execute it: the status shown and the reply body it shows."""
        block = f"#operations-default-{operation}"
        self.page.click(f"{block} .opblock-summary-control")
        self.page.click(f"{block} button.try-out__btn")
        if fill is not None:
            fill(block)
        self.page.click(f"{block} button.execute")
        body = self.page.wait_for_selector(
            f"{block} .live-responses-table .response-col_description pre", timeout=30000
        )
        assert body is not None
        status = self.page.inner_text(f"{block} .live-responses-table tbody .response-col_status").strip()
        return status, json.loads(body.inner_text())

    def check(self) -> None:
        assert self.problems == [], self.problems
        strangers = [url for url in self.requested if not url.startswith(self.origin + "/")]
        assert strangers == [], f"requests to another origin: {strangers}"


@contextlib.contextmanager
def chromium_at(origin: str) -> Iterator[Watched]:
    """Debian's chromium, headless, driven by playwright (which downloads no browser)."""
    chromium = shutil.which("chromium")
    _need(chromium, "Debian's chromium (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need(None, "playwright (the dev extras)")
        raise
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1000})
            watched = Watched(page, origin)
            problems = watched.problems
            page.on("requestfailed", lambda r: problems.append(f"failed: {r.url} {r.failure}"))
            page.on("request", lambda r: watched.requested.append(r.url))
            page.on("response", lambda r: problems.extend([f"{r.status}: {r.url}"] if r.status >= 400 else []))
            page.on("console", lambda m: problems.extend([f"console: {m.text}"] if m.type == "error" else []))
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            yield watched
        finally:
            browser.close()


@pytest.mark.slow
@pytest.mark.nginx
def test_try_it_out_in_chromium(behind_nginx: Nginx, tmp_path: Path) -> None:
    with chromium_at(behind_nginx.url) as browser:
        paths = browser.open_docs()
        assert {"/predict", "/v2/models/{model}/infer", "/v2/models/{model}/classify", "/metrics"} <= set(paths)
        browser.check()  # the page and its files, loaded without a key
        page = browser.page
        # The key, as a user enters it under "Authorize" (the document's bearerAuth scheme).
        page.click("button.authorize")
        page.fill(".modal-ux #auth-bearer-value", API_KEY)
        page.click(".modal-ux button.authorize")
        page.click(".modal-ux button.btn-done")

        def upload_the_cat(block: str) -> None:
            top_k = f"{block} tr[data-param-name='top_k'][data-param-in='query'] input"
            assert page.input_value(top_k) == "3"  # the fragment's example
            page.set_input_files(f"{block} input[type=file]", str(CAT))

        status, reply = browser.try_it_out("taskPredict", upload_the_cat)
        labels = [p["label"] for p in reply["predictions"][0]]
        assert status == "200" and labels[0] == "Egyptian cat" and "tabby" in labels and len(labels) == 3, labels
        _screenshot(page, tmp_path / "docs-page.png")
        browser.check()
        assert f"{browser.origin}/predict?top_k=3" in browser.requested


MINILM_BUILT = (REPO / "models" / "minilm" / "model.onnx").is_file()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "operation", "answer"),
    [
        ("iris", "taskV1Predict", "predictions"),  # KServe v1 instances
        pytest.param("minilm", "taskEmbeddings", "data", marks=pytest.mark.minilm),  # OpenAI embeddings
    ],
)
def test_json_examples_work_as_filled_in(tmp_path: Path, config: str, operation: str, answer: str) -> None:
    if config == "minilm":
        _need(MINILM_BUILT, "models/minilm (make minilm; .ci/run builds it)")
    with running_server(tmp_path, {"ONNXPOOL_CONFIG": config, "ONNXPOOL_SERVER__WORKERS": "1"}, workers=1) as server:
        with chromium_at(server.url) as browser:
            browser.open_docs()
            status, reply = browser.try_it_out(operation)  # the body exactly as the page fills it in
            browser.check()
    assert status == "200" and reply[answer], reply


def _screenshot(page: Any, path: Path) -> None:
    """The /predict operation from its title down to the reply; kept where KEEP_DOCS_SCREENSHOT says."""
    # Page coordinates (a full-page clip), not the viewport's.
    box = page.evaluate(
        """([block, reply]) => {
            const a = document.querySelector(block).getBoundingClientRect();
            const b = document.querySelector(reply).getBoundingClientRect();
            return {x: a.left + scrollX, y: a.top + scrollY, width: a.width, height: b.bottom - a.top};
        }""",
        [PREDICT, f"{PREDICT} .live-responses-table"],
    )
    page.screenshot(path=str(path), clip=box, full_page=True)
    assert path.stat().st_size > 10_000
    keep = os.environ.get("KEEP_DOCS_SCREENSHOT")
    if keep:  # 256 colours: a third of the size, the same picture of flat UI colours
        with Image.open(path) as shot:
            shot.convert("RGB").quantize(256).save(keep, optimize=True)
