"""`GET /docs`: Swagger UI over `/openapi.json`, to read the API and try it in a browser.

The page is static: `server/swagger/index.html` and its start-up script, plus Swagger UI's
own scripts and styles from the `flask-swagger-ui` package's bundled copy (only its files,
not its blueprint), all served from this server under `/docs/`: it works with no
internet, and its Content-Security-Policy allows nothing from another origin. Every path
in the page is relative (`docs/...`, `openapi.json`), so it works behind nginx and in the
pod as it does on gunicorn's port.

The page and its files need no API key (`server.auth` keeps `/docs` open, like
`/openapi.json`); a request tried from the page carries the key entered under
"Authorize" (the document's `bearerAuth` scheme). `[server] docs = false` turns it off.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from flask import Blueprint, Flask, Response, abort, redirect, send_from_directory

from onnxpool.tasks.server_routes import DOCS, DOCS_FILE, DOCS_SLASH

OWN_FILES = Path(__file__).resolve().parent / "swagger"
# Swagger UI's files the page loads: served by name, nothing else from the package's folder.
SWAGGER_UI_FILES = frozenset(
    {"swagger-ui-bundle.js", "swagger-ui.css", "index.css", "favicon-16x16.png", "favicon-32x32.png"}
)
# The page and its scripts come from here only. Swagger UI sets inline styles, shows
# data: and blob: images (its icons; an image reply), and calls the API on this origin.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)
ASSET_MAX_AGE = 3600


def swagger_ui_dist() -> Path:
    """The folder of Swagger UI's built files inside the installed flask-swagger-ui package."""
    return Path(str(files("flask_swagger_ui") / "dist"))


def install(app: Flask, enabled: bool) -> None:
    """Serve the page unless `[server] docs = false`."""
    if enabled:
        app.register_blueprint(make_blueprint())


def make_blueprint() -> Blueprint:
    """The page's routes; fails at app build (in the master) if Swagger UI's files are missing."""
    dist = swagger_ui_dist()
    missing = sorted(name for name in SWAGGER_UI_FILES if not (dist / name).is_file())
    if missing:
        raise RuntimeError(f"flask-swagger-ui's files {missing} are missing from {dist}: reinstall onnxpool")
    blueprint = Blueprint("docs", __name__)

    def _secured(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @blueprint.get(DOCS)
    def docs_page() -> Response:
        return _secured(send_from_directory(OWN_FILES, "index.html", max_age=0))

    @blueprint.get(DOCS_SLASH)
    def docs_slash() -> Response:
        # The page's relative paths assume /docs; relative, so a proxy's prefix is kept.
        return redirect("../docs", 308)  # type: ignore[return-value]

    @blueprint.get(DOCS_FILE)
    def docs_file(name: str) -> Response:
        if name == "onnxpool-docs.js":
            return _secured(send_from_directory(OWN_FILES, name, max_age=0))
        if name not in SWAGGER_UI_FILES:
            abort(404)
        return _secured(send_from_directory(dist, name, max_age=ASSET_MAX_AGE))

    return blueprint
