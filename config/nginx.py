"""Render the nginx site in front of onnxpool from the settings (no I/O but reading the template).

The template is `config/nginx/onnxpool.conf.template`; its fields are written
`%{name}` (nginx itself uses `$`). `config/nginx/onnxpool.conf` is the template
rendered with the default settings, kept in sync by a test. `onnxpool nginx`
(nginx run beside onnxpool, e.g. in its pod) adds a main configuration around the
same site, from `config/nginx/nginx.conf.template`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template

from onnxpool.config.settings import Settings

NGINX_DIR = Path(__file__).resolve().parent / "nginx"
TEMPLATE_FILE = NGINX_DIR / "onnxpool.conf.template"
RENDERED_DEFAULT = NGINX_DIR / "onnxpool.conf"
MAIN_TEMPLATE_FILE = NGINX_DIR / "nginx.conf.template"
PROXY_TEMPLATE_FILE = NGINX_DIR / "proxy.conf.template"
ROUTER_FILE = NGINX_DIR / "route_by_model.js"
ROUTER_MODULE = "ngx_http_js_module.so"
""" nginx's JavaScript module (Debian: libnginx-mod-http-js): routes a request by the `model` its JSON body names."""
EMBEDDINGS_ROUTE = "/v1/embeddings"
"""The one route whose model is named in the body (OpenAI's); with several text models nginx reads it."""
ANY_POOL = "onnxpool"
"""The upstream of every pool: routes every pool answers for the host (health, index, metrics)."""


class SiteTemplate(Template):
    """string.Template with `%{name}` fields, so nginx's `$variables` stay as they are."""

    delimiter = "%"


def upstream_servers(settings: Settings) -> tuple[str, ...]:
    """The instances nginx balances: [nginx] upstreams, else this host's server.bind."""
    return settings.nginx.upstreams or (settings.server.bind,)


@dataclass(frozen=True)
class PoolRoute:
    """One model's pool behind the front door: its names, its address and its task's routes."""

    name: str
    aliases: tuple[str, ...]
    address: str
    """`unix:/path.sock` or `HOST:PORT`."""
    routes: tuple[str, ...]
    """The task's POST routes (`/predict`, `/v1/embeddings`, `/v2/models/<model>/classify`...)."""

    @property
    def upstream(self) -> str:
        return f"onnxpool_{re.sub(r'[^A-Za-z0-9_]', '_', self.name)}_{_short_hash(self.name)}"

    @property
    def url_names(self) -> tuple[str, ...]:
        """The names a URL may carry (an alias with a `/`, a Hugging Face id, is for request bodies only)."""
        return (self.name, *(alias for alias in self.aliases if "/" not in alias))


def _short_hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:6]


def shared_routes(pools: Sequence[PoolRoute]) -> dict[str, list[PoolRoute]]:
    """Routes without a model in the URL (`/predict`, `/v1/embeddings`) and the pools that have each."""
    found: dict[str, list[PoolRoute]] = {}
    for pool in pools:
        for route in pool.routes:
            if "<model>" not in route:
                found.setdefault(route, []).append(pool)
    return found


def needs_router(pools: Sequence[PoolRoute]) -> bool:
    """Several pools take OpenAI embeddings: nginx must read each body's `model` (its js module)."""
    return len(shared_routes(pools).get(EMBEDDINGS_ROUTE, [])) > 1


def _upstream_block(name: str, servers: Sequence[str], settings: Settings, comment: bool) -> str:
    nginx = settings.nginx
    health = f"max_fails={nginx.max_fails} fail_timeout={nginx.fail_timeout}s"
    lines = [f"upstream {name} {{"]
    if comment:
        lines += [
            "    # One line per onnxpool instance: `server HOST:PORT ...;` or `server unix:/path.sock ...;`.",
            "    # max_fails/fail_timeout: passive health; a failing instance rests, the others take its load.",
        ]
    lines += [f"    server {address} {health};" for address in servers]
    if comment:
        lines += [
            "    # Idle keep-alive connections per nginx worker (reused by gthread workers;",
            "    # sync workers close after each reply, which is harmless).",
        ]
    lines.append(f"    keepalive {nginx.keepalive};" if nginx.keepalive else "    # keepalive off")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _nginx_regex(names: Sequence[str]) -> str:
    return "|".join(re.sub(r"([.\\^$|?*+()\[\]{}])", r"\\\1", name) for name in names)


def _routing(pools: Sequence[PoolRoute], router: Path | None) -> str:
    """The map from a request's URI to its model's pool (and the js router for body-named models)."""
    lines = [
        "",
        "# Which model's pool answers: /v2/models/<name>/..., /v1/models/<name>..., a task's own",
        "# route, else any pool (the host's routes: health, GET /v2/models, repository index, metrics).",
        "map $uri $onnxpool_pool {",
        f"    default {ANY_POOL};",
    ]
    # The API page and its document describe one model: the first one's.
    lines.append(f"    /openapi.json {pools[0].upstream};")
    lines.append(f'    "~^/docs(/|$)" {pools[0].upstream};')
    for route, owners in shared_routes(pools).items():
        if route == EMBEDDINGS_ROUTE and len(owners) > 1:
            continue  # the body names the model: route_by_model.js
        lines.append(f"    {route} {owners[0].upstream};")
    for pool in pools:
        names = _nginx_regex(pool.url_names)
        lines.append(f'    "~^/v2/models/({names})(/|$)" {pool.upstream};')
        lines.append(f'    "~^/v1/models/({names})(:|/|$)" {pool.upstream};')
    lines.append("}")
    if router is not None:
        lines.append(f"js_import onnxpool_router from {router};")
    return "\n".join(lines) + "\n"


def router_script(pools: Sequence[PoolRoute]) -> str:
    """route_by_model.js with this host's table: each name and alias -> its pool's named location."""
    owners = shared_routes(pools).get(EMBEDDINGS_ROUTE, [])
    table = {name: f"@{pool.upstream}" for pool in owners for name in (pool.name, *pool.aliases)}
    text = ROUTER_FILE.read_text(encoding="utf-8")
    return SiteTemplate(text).substitute(
        table=json.dumps(table, sort_keys=True), served=json.dumps(", ".join(pool.name for pool in owners))
    )


def _model_locations(settings: Settings, pools: Sequence[PoolRoute], router: bool) -> str:
    if not router:
        return ""
    owners = shared_routes(pools)[EMBEDDINGS_ROUTE]
    text = [
        "    # Several text models: nginx reads the body (kept in memory) and its `model` picks the pool.",
        f"    location = {EMBEDDINGS_ROUTE} {{",
        f"        client_body_buffer_size {settings.server.max_body_bytes};",
        "        client_body_in_single_buffer on;",
        "        js_content onnxpool_router.route;",
        "    }",
    ]
    for pool in owners:
        text += [f"    location @{pool.upstream} {{", _proxy(settings, pool.upstream) + "    }"]
    return "\n".join(text) + "\n\n"


def _proxy(settings: Settings, upstream: str) -> str:
    nginx = settings.nginx
    lines = PROXY_TEMPLATE_FILE.read_text(encoding="utf-8").splitlines(keepends=True)
    text = "".join(line for line in lines if not line.startswith("#"))
    return SiteTemplate(text).substitute(
        pass_=upstream,
        connect_timeout=nginx.connect_timeout,
        timeout=settings.server.timeout,
        next_upstream_tries=nginx.next_upstream_tries,
    )


def render_site(
    settings: Settings,
    template: str | None = None,
    pools: Sequence[PoolRoute] = (),
    router: Path | None = None,
) -> str:
    """The nginx site for these settings, as text.

    With `pools` (several models, onnxpool.host), each model's requests go to its own pool and the
    host's routes to any of them; `router` is route_by_model.js as written for this host
    (`router_script`), needed when several pools take OpenAI embeddings (`needs_router`).
    """
    nginx = settings.nginx
    access_log = f"    access_log {nginx.access_log} onnxpool;" if nginx.access_log else "    access_log off;"
    text = TEMPLATE_FILE.read_text(encoding="utf-8") if template is None else template
    if pools:
        upstreams = _upstream_block(ANY_POOL, [pool.address for pool in pools], settings, comment=False) + "".join(
            _upstream_block(pool.upstream, [pool.address], settings, comment=False) for pool in pools
        )
        routing, passed = _routing(pools, router if needs_router(pools) else None), "$onnxpool_pool"
    else:
        upstreams = _upstream_block(ANY_POOL, upstream_servers(settings), settings, comment=True)
        routing, passed = "", ANY_POOL
    return SiteTemplate(text).substitute(
        upstreams=upstreams,
        routing=routing,
        model_locations=_model_locations(settings, pools, router is not None and needs_router(pools)),
        proxy=_proxy(settings, passed),
        listen=nginx.listen,
        server_name=nginx.server_name,
        access_log=access_log,
        max_body_bytes=settings.server.max_body_bytes,
        timeout=settings.server.timeout,
        client_timeout=nginx.client_timeout,
    )


def render_main(settings: Settings, site: Path, modules: Sequence[Path] = ()) -> str:
    """nginx's main configuration for `onnxpool nginx`: pid, temp paths beside [nginx] pidfile."""
    if not settings.nginx.pidfile:
        raise ValueError("[nginx] pidfile is not set: `onnxpool nginx` keeps everything it writes beside it")
    pidfile = Path(settings.nginx.pidfile)
    return SiteTemplate(MAIN_TEMPLATE_FILE.read_text(encoding="utf-8")).substitute(
        pidfile=pidfile,
        prefix=pidfile.parent,
        site=site,
        graceful_timeout=settings.server.graceful_timeout,
        modules="".join(f"load_module {module};\n" for module in modules),
    )
