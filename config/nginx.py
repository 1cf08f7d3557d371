"""Render the nginx site in front of onnxpool from the settings (no I/O but reading the template).

The template is `config/nginx/onnxpool.conf.template`; its fields are written
`%{name}` (nginx itself uses `$`). `config/nginx/onnxpool.conf` is the template
rendered with the default settings, kept in sync by a test. `onnxpool nginx`
(nginx run beside onnxpool, e.g. in its pod) adds a main configuration around the
same site, from `config/nginx/nginx.conf.template`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from string import Template

from onnxpool.config.settings import Settings

NGINX_DIR = Path(__file__).resolve().parent / "nginx"
TEMPLATE_FILE = NGINX_DIR / "onnxpool.conf.template"
RENDERED_DEFAULT = NGINX_DIR / "onnxpool.conf"
MAIN_TEMPLATE_FILE = NGINX_DIR / "nginx.conf.template"
PROXY_TEMPLATE_FILE = NGINX_DIR / "proxy.conf.template"
ANY_POOL = "onnxpool"
"""The upstream of onnxpool's instances (a host serving several models names its own upstreams)."""


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


def proxy_block(settings: Settings, upstream: str) -> str:
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
    *,
    upstreams: str | None = None,
    routing: str = "",
    model_locations: str = "",
    passed: str = ANY_POOL,
) -> str:
    """The nginx site for these settings, as text.

    By default one upstream of onnxpool instances ([nginx] upstreams, else server.bind). A host serving
    several models (onnxpool.host.front_door) gives its own `upstreams`, the `routing` map that picks
    one per request, the `model_locations` of the models named in request bodies, and the variable
    `passed` to proxy_pass.
    """
    nginx = settings.nginx
    access_log = f"    access_log {nginx.access_log} onnxpool;" if nginx.access_log else "    access_log off;"
    text = TEMPLATE_FILE.read_text(encoding="utf-8") if template is None else template
    if upstreams is None:
        upstreams = upstream_block(ANY_POOL, upstream_servers(settings), settings, comment=True)
    return SiteTemplate(text).substitute(
        upstreams=upstreams,
        routing=routing,
        model_locations=model_locations,
        proxy=proxy_block(settings, passed),
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
