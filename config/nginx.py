"""Render the nginx site in front of onnxpool from the settings (no I/O but reading the template).

The template is `config/nginx/onnxpool.conf.template`; its fields are written
`%{name}` (nginx itself uses `$`). `config/nginx/onnxpool.conf` is the template
rendered with the default settings, kept in sync by a test. `onnxpool nginx`
(nginx run beside onnxpool, e.g. in its pod) adds a main configuration around the
same site, from `config/nginx/nginx.conf.template`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from string import Template

from onnxpool.config.callers import CallerBook
from onnxpool.config.nginx_callers import (
    LANE_VARIABLE,
    http_block,
    lane_name,
    lane_servers,
    log_field,
    proxy_headers,
    server_block,
)
from onnxpool.config.settings import Settings

NGINX_DIR = Path(__file__).resolve().parent / "nginx"
TEMPLATE_FILE = NGINX_DIR / "onnxpool.conf.template"
RENDERED_DEFAULT = NGINX_DIR / "onnxpool.conf"
MAIN_TEMPLATE_FILE = NGINX_DIR / "nginx.conf.template"
PROXY_TEMPLATE_FILE = NGINX_DIR / "proxy.conf.template"
GRPC_TEMPLATE_FILE = NGINX_DIR / "grpc.conf.template"
CALLERS_TEMPLATE_FILE = NGINX_DIR / "callers.js"
ANY_POOL = "onnxpool"
"""The upstream of onnxpool's instances (a host serving several models names its own upstreams)."""
GRPC_POOL = "onnxpool_grpc"
"""The upstream of the instances' gRPC addresses ([nginx] grpc_upstreams, else [server] grpc_bind)."""


class SiteTemplate(Template):
    """string.Template with `%{name}` fields, so nginx's `$variables` stay as they are."""

    delimiter = "%"


def upstream_servers(settings: Settings) -> tuple[str, ...]:
    """The instances nginx balances: [nginx] upstreams, else this host's server.bind."""
    return settings.nginx.upstreams or (settings.server.bind,)


def upstream_block(name: str, servers: Sequence[str], settings: Settings, comment: bool) -> str:
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


def laned_upstreams(
    name: str,
    servers: Sequence[str],
    settings: Settings,
    callers: CallerBook | None,
    *,
    comment: bool = False,
    bound: int | None = None,
) -> str:
    """The upstream `name`, and with callers told apart one per lane (`<name>_lane<k>`): each instance's
    lane k socket. `bound`: the lanes the instances bound (a pool's, from its description; the host's
    routes have none); a lane past them is the instances' own socket. None: every lane."""
    text = upstream_block(name, servers, settings, comment=comment)
    lanes = callers.lane_count if callers is not None else 0
    for lane in range(1, lanes + 1):
        addresses = lane_servers(servers, lane) if bound is None or lane <= bound else list(servers)
        text += upstream_block(lane_name(name, lane), addresses, settings, comment=False)
    return text


def _template(path: Path) -> str:
    """A template file without its leading comment lines (they document the file, not the site)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("#"))


def grpc_block(settings: Settings, callers: CallerBook | None = None) -> str:
    """The site's gRPC server ([nginx] grpc_listen; "" when unset), in front of the instances' gRPC."""
    nginx = settings.nginx
    if not nginx.grpc_listen:
        return ""
    book = callers if callers is not None and callers.enabled else None
    servers = nginx.grpc_upstreams or (settings.server.grpc_bind,)
    return "\n" + SiteTemplate(_template(GRPC_TEMPLATE_FILE)).substitute(
        upstream=upstream_block(GRPC_POOL, servers, settings, comment=False),
        upstream_name=GRPC_POOL,
        grpc_listen=nginx.grpc_listen,
        server_name=nginx.server_name,
        access_log=_access_log(settings),
        max_body_bytes=settings.server.max_body_bytes,
        client_timeout=nginx.client_timeout,
        caller_limits=server_block(book, grpc=True) if book else "",
        caller_headers=proxy_headers(book, "grpc_set_header") if book else "",
        connect_timeout=nginx.connect_timeout,
        timeout=settings.server.timeout,
        next_upstream_tries=nginx.next_upstream_tries,
    )


def _access_log(settings: Settings) -> str:
    nginx = settings.nginx
    return f"    access_log {nginx.access_log} onnxpool;" if nginx.access_log else "    access_log off;"


def proxy_block(settings: Settings, upstream: str, callers: CallerBook | None = None) -> str:
    """One location's proxying to `upstream`; with callers told apart, to the caller's lane of it."""
    nginx = settings.nginx
    laned = callers is not None and callers.enabled
    return SiteTemplate(_template(PROXY_TEMPLATE_FILE)).substitute(
        pass_=upstream + LANE_VARIABLE if laned else upstream,
        caller_headers=proxy_headers(callers) if callers is not None else "",
        connect_timeout=nginx.connect_timeout,
        timeout=settings.server.timeout,
        next_upstream_tries=nginx.next_upstream_tries,
    )


def render_site(
    settings: Settings,
    template: str | None = None,
    *,
    upstreams: str | None = None,
    routing: str = "",
    model_locations: str = "",
    passed: str = ANY_POOL,
    callers: CallerBook | None = None,
    script: str | None = None,
    quota_model: str = "",
) -> str:
    """The nginx site for these settings, as text.

    By default one upstream of onnxpool instances ([nginx] upstreams, else server.bind). A host serving
    several models (onnxpool.host.front_door) gives its own `upstreams`, the `routing` map that picks
    one per request, the `model_locations` of the models named in request bodies, and the variable
    `passed` to proxy_pass. With `callers` told apart (config/nginx_callers.py): `script` is callers.js's
    path (by key), `quota_model` what a quota is counted per (default the one model's name).
    """
    book = callers if callers is not None and callers.enabled else None
    nginx = settings.nginx
    text = TEMPLATE_FILE.read_text(encoding="utf-8") if template is None else template
    if upstreams is None:
        upstreams = laned_upstreams(ANY_POOL, upstream_servers(settings), settings, book, comment=True)
    return SiteTemplate(text).substitute(
        upstreams=upstreams,
        routing=routing,
        callers=http_block(book, script, quota_model or settings.model.name) if book else "",
        caller_limits=server_block(book) if book else "",
        log_caller=log_field(book) if book else "",
        model_locations=model_locations,
        proxy=proxy_block(settings, passed, book),
        listen=nginx.listen,
        server_name=nginx.server_name,
        access_log=_access_log(settings),
        max_body_bytes=settings.server.max_body_bytes,
        timeout=settings.server.timeout,
        client_timeout=nginx.client_timeout,
        # A host serving several models routes gRPC by the model named inside each call (its router).
        grpc="" if settings.models else grpc_block(settings, book),
    )


def render_callers_script(callers: CallerBook) -> str:
    """callers.js (nginx's js module names a request's caller from its key) with these keys' digests."""
    table = {digest.hex(): name for digest, name in callers.digests}
    text = CALLERS_TEMPLATE_FILE.read_text(encoding="utf-8")
    return SiteTemplate(text).substitute(table=json.dumps(table, sort_keys=True))


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
