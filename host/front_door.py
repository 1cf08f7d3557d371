"""The front door of a host serving several models: nginx's files, rendered from the models' pools.

One nginx on `[server] bind` routes each request by its URI (a `map`): `/v2/models/<name or
alias>/...` and `/v1/models/<name or alias>...` to that model's pool, a task route without a
model in it (`/predict`, `/v1/embeddings`) to the first model that has it, except OpenAI
embeddings when several models take them (nginx's js module reads the body's `model`,
route_by_model.js), and everything else to the host's routes (host/routes.py: health, the model
lists, the repository index, one /metrics, /openapi.json and /docs, the 404 for an unknown model).
The site itself is config/nginx's, as for one model behind `onnxpool nginx`.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from onnxpool.config.callers import POOLS_BIND, CallerBook, caller_book_of
from onnxpool.config.loader import ConfigError, LoadedSettings
from onnxpool.config.nginx import SiteTemplate, laned_upstreams, proxy_block, render_main, render_site
from onnxpool.config.settings import Settings
from onnxpool.proxy import TEMP_FOLDERS, required_js_module, write_callers_script

ROUTER_FILE = Path(__file__).resolve().with_name("route_by_model.js")
EMBEDDINGS_ROUTE = "/v1/embeddings"
"""The one route whose model is named in the body (OpenAI's); with several text models nginx reads it."""
HOST_UPSTREAM = "onnxpool_host"
"""The host's routes (host/routes.py): every request that names no model the host serves."""


class FrontDoorError(Exception):
    """The front door cannot be written as asked: one line for the operator."""


@dataclass(frozen=True)
class PoolRoute:
    """One model's pool behind the front door: its names, its address and its task's routes."""

    name: str
    aliases: tuple[str, ...]
    address: str
    """`unix:/path.sock` or `HOST:PORT`."""
    routes: tuple[str, ...]
    """The task's POST routes (`/predict`, `/v1/embeddings`, `/v2/models/<model>/classify`...)."""
    lanes: int = 0
    """Callers' lanes its master bound at start (a lane past them is its socket: lane 0)."""

    @property
    def upstream(self) -> str:
        return f"onnxpool_{re.sub(r'[^A-Za-z0-9_]', '_', self.name)}_{_short_hash(self.name)}"

    @property
    def url_names(self) -> tuple[str, ...]:
        """The names a URL may carry (an alias with a `/`, a Hugging Face id, is for request bodies only)."""
        return (self.name, *(alias for alias in self.aliases if "/" not in alias))


def _short_hash(text: str) -> str:
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


def _nginx_regex(names: Sequence[str]) -> str:
    return "|".join(re.sub(r"([.\\^$|?*+()\[\]{}])", r"\\\1", name) for name in names)


def _routing(pools: Sequence[PoolRoute], router: Path | None) -> str:
    """The map from a request's URI to its model's pool (and the js router for body-named models)."""
    lines = [
        "",
        "# Which model's pool answers: /v2/models/<name>/..., /v1/models/<name>..., a task's own",
        "# route, else the host's routes (health, model lists, repository index, metrics, API page).",
        "map $uri $onnxpool_pool {",
        f"    default {HOST_UPSTREAM};",
    ]
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


def _model_locations(settings: Settings, pools: Sequence[PoolRoute], callers: CallerBook) -> str:
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
        text += [f"    location @{pool.upstream} {{", proxy_block(settings, pool.upstream, callers) + "    }"]
    return "\n".join(text) + "\n\n"


def render_host_site(
    settings: Settings,
    pools: Sequence[PoolRoute],
    host_address: str,
    router: Path | None,
    callers: CallerBook,
    script: Path | None = None,
) -> str:
    """The site: an upstream per pool and one for the host's routes (each with its callers' lanes), the
    routing map, the locations of body-routed models (`router`: route_by_model.js as written for this
    host, when `needs_router`); `script`: callers.js, when callers are named by key. A caller's quota
    is counted per pool."""
    upstreams = laned_upstreams(HOST_UPSTREAM, [host_address], settings, callers, bound=0) + "".join(
        laned_upstreams(pool.upstream, [pool.address], settings, callers, bound=pool.lanes) for pool in pools
    )
    routed = router if needs_router(pools) else None
    return render_site(
        settings,
        upstreams=upstreams,
        routing=_routing(pools, routed),
        model_locations=_model_locations(settings, pools, callers) if routed is not None else "",
        passed="$onnxpool_pool",
        callers=callers,
        script=str(script or ""),
        quota_model="$onnxpool_pool",
    )


def front_door_callers(settings: Settings) -> CallerBook:
    """The callers the front door keeps apart (reads the keys file); FrontDoorError names a mistake."""
    try:
        return caller_book_of(settings, POOLS_BIND)  # lanes beside the pools' sockets, not nginx's own bind
    except ConfigError as exc:
        raise FrontDoorError(str(exc)) from None


def write_front_door(
    folder: Path, settings: Settings, pools: Sequence[PoolRoute], host_address: str, binary: str
) -> Path:
    """Write nginx's files into `folder` (settings.nginx: listen, pidfile, access log as the host sets
    them); returns its main configuration. Raises NginxFilesError when the js module is needed and missing,
    ConfigError for the keys file."""
    router = folder / "route_by_model.js"
    callers = front_door_callers(settings)
    script = write_callers_script(folder, callers)
    needs = [
        *(
            ["several models take OpenAI embeddings: nginx routes them by the body's `model`"]
            if needs_router(pools)
            else []
        ),
        *(["callers are named by their keys"] if script is not None else []),
    ]
    modules = [required_js_module(binary, " and ".join(needs), FrontDoorError)] if needs else []
    if needs_router(pools):
        router.write_text(router_script(pools), encoding="utf-8")
    site = folder / "onnxpool-site.conf"
    site.write_text(render_host_site(settings, pools, host_address, router, callers, script), encoding="utf-8")
    main = folder / "nginx.conf"
    main.write_text(render_main(settings, site, modules), encoding="utf-8")
    return main


def listen(bind: str) -> str:
    """nginx's `listen` for [server] bind. On a TCP port with `reuseport`: a restarted nginx binds beside
    the workers its killed master left, which serve until it answers (host/program.py, --hand-over)."""
    return bind if bind.startswith("unix:") else f"{bind} reuseport"


def write_checked_front_door(
    folder: Path, loaded: LoadedSettings, pools: Sequence[PoolRoute], routes_address: str, binary: str
) -> Path:
    """The front door's files in `folder` (its pid and temp files there too, nginx on [server] bind, an
    access log only when the file names one), checked by `nginx -t`; returns the main configuration.
    Raises FrontDoorError with nginx's own complaint."""
    for name in TEMP_FOLDERS:
        (folder / "tmp" / name).mkdir(parents=True, exist_ok=True)
    settings = loaded.settings
    nginx = settings.nginx
    explicit_log = not loaded.sources.get("nginx.access_log", "default").startswith("default")
    settings = settings.model_copy(
        update={
            "nginx": nginx.model_copy(
                update={
                    "listen": listen(settings.server.bind),
                    "pidfile": str(folder / "nginx.pid"),
                    "access_log": nginx.access_log if explicit_log else "",
                }
            )
        }
    )
    main = write_front_door(folder, settings, pools, routes_address, binary)
    check = subprocess.run([binary, "-p", str(folder), "-c", str(main), "-t", "-q"], check=False, capture_output=True)
    if check.returncode != 0:
        raise FrontDoorError(f"nginx refused {main}: {check.stderr.decode(errors='replace').strip()}")
    return main
