"""Render the nginx site in front of onnxpool from the settings (no I/O but reading the template).

The template is `config/nginx/onnxpool.conf.template`; its fields are written
`%{name}` (nginx itself uses `$`). `config/nginx/onnxpool.conf` is the template
rendered with the default settings, kept in sync by a test. `onnxpool nginx`
(nginx run beside onnxpool, e.g. in its pod) adds a main configuration around the
same site, from `config/nginx/nginx.conf.template`.
"""

from __future__ import annotations

from pathlib import Path
from string import Template

from onnxpool.config.settings import Settings

NGINX_DIR = Path(__file__).resolve().parent / "nginx"
TEMPLATE_FILE = NGINX_DIR / "onnxpool.conf.template"
RENDERED_DEFAULT = NGINX_DIR / "onnxpool.conf"
MAIN_TEMPLATE_FILE = NGINX_DIR / "nginx.conf.template"


class SiteTemplate(Template):
    """string.Template with `%{name}` fields, so nginx's `$variables` stay as they are."""

    delimiter = "%"


def upstream_servers(settings: Settings) -> tuple[str, ...]:
    """The instances nginx balances: [nginx] upstreams, else this host's server.bind."""
    return settings.nginx.upstreams or (settings.server.bind,)


def render_site(settings: Settings, template: str | None = None) -> str:
    """The nginx site for these settings, as text."""
    nginx = settings.nginx
    health = f"max_fails={nginx.max_fails} fail_timeout={nginx.fail_timeout}s"
    servers = "\n".join(f"    server {address} {health};" for address in upstream_servers(settings))
    access_log = f"    access_log {nginx.access_log} onnxpool;" if nginx.access_log else "    access_log off;"
    text = TEMPLATE_FILE.read_text(encoding="utf-8") if template is None else template
    return SiteTemplate(text).substitute(
        upstream_servers=servers,
        keepalive=f"    keepalive {nginx.keepalive};" if nginx.keepalive else "    # keepalive off",
        listen=nginx.listen,
        server_name=nginx.server_name,
        access_log=access_log,
        max_body_bytes=settings.server.max_body_bytes,
        connect_timeout=nginx.connect_timeout,
        timeout=settings.server.timeout,
        next_upstream_tries=nginx.next_upstream_tries,
        client_timeout=nginx.client_timeout,
    )


def render_main(settings: Settings, site: Path) -> str:
    """nginx's main configuration for `onnxpool nginx`: pid, temp paths beside [nginx] pidfile."""
    if not settings.nginx.pidfile:
        raise ValueError("[nginx] pidfile is not set: `onnxpool nginx` keeps everything it writes beside it")
    pidfile = Path(settings.nginx.pidfile)
    return SiteTemplate(MAIN_TEMPLATE_FILE.read_text(encoding="utf-8")).substitute(
        pidfile=pidfile,
        prefix=pidfile.parent,
        site=site,
        graceful_timeout=settings.server.graceful_timeout,
    )
