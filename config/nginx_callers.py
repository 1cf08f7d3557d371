"""The nginx pieces that keep callers apart (config/callers.py): who is calling, its lane, its quota.

- who: `$onnxpool_caller_found`, the known caller's name or "" (none): by key (nginx's js module
  hashes the bearer key and looks the digest up, callers.js), by header (a map), by address (geo);
  `$onnxpool_caller` is the same with `anonymous` for none (the access log's `caller=`);
- its lane: `$onnxpool_lane`, `_lane<k>` appended to an upstream's name (`<upstream>_lane<k>`
  holds every instance's lane k socket, workers/lanes.py); "" is the upstream itself, lane 0;
- its quota: per caller, counted per model, `limit_req` (rate and burst) and `limit_conn`
  (concurrency) zones keyed by caller and model, "" for everyone else; over it, 429 with
  Retry-After in the route's API shape (OpenAI's error object on /v1/embeddings).
Nothing is rendered while callers are not told apart: the site is as without callers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from onnxpool.config.callers import ANONYMOUS, CALLER_HEADER, Caller, CallerBook, lane_addresses

CALLERS_SCRIPT = "callers.js"
"""The js file beside the site (identify = "key")."""
LANE_VARIABLE = "$onnxpool_lane"
QUOTA_MESSAGE = (
    "caller $onnxpool_caller is over its quota ([caller.$onnxpool_caller]); retry after $onnxpool_retry_after s"
)
"""What a caller over its quota is told (the REST error's text, and gRPC's grpc-message: config/nginx_grpc.py)."""


def needs_js(book: CallerBook) -> bool:
    """nginx must hash keys (its js module) to know the caller."""
    return book.enabled and book.settings.identify == "key"


def lane_name(upstream: str, lane: int) -> str:
    return f"{upstream}_lane{lane}"


def lane_servers(servers: Sequence[str], lane: int) -> list[str]:
    """Every instance's lane `lane` address."""
    return [lane_addresses(server, lane)[lane - 1] for server in servers]


def _rate(per_second: float) -> str:
    """nginx's rate: whole requests per second, else per minute (its finest step)."""
    if per_second >= 1 and per_second == int(per_second):
        return f"{int(per_second)}r/s"
    return f"{max(1, round(per_second * 60))}r/m"


def retry_after(caller: Caller) -> int:
    """Seconds a caller over its quota is told to wait: one request's worth of its rate, at least 1."""
    rate = caller.settings.rate
    return max(1, math.ceil(1 / rate)) if rate else 1


def http_block(book: CallerBook, script: str | None, model: str) -> str:
    """http-level: the caller variables, its lane, the quota zones (`model`: the quota's per-model part,
    an nginx variable or a name). `script`: callers.js's path when identify = "key"."""
    if not book.enabled:
        return ""
    lines = ["", '# Who is calling (config/callers.py): a known caller\'s name, else "".']
    if book.settings.identify == "key":
        if script is None:
            raise ValueError("callers by key: nginx needs callers.js's path")
        lines += [
            f"js_import onnxpool_callers from {script};",
            "js_set $onnxpool_caller_found onnxpool_callers.caller;",
        ]
    elif book.settings.identify == "header":
        variable = "$http_" + book.settings.header.lower().replace("-", "_")
        lines += [f"map {variable} $onnxpool_caller_found {{", '    default "";']
        lines += [f"    {caller.name} {caller.name};" for caller in book.callers]
        lines.append("}")
    else:
        lines += ["geo $onnxpool_caller_found {", '    default "";']
        for caller in book.callers:
            lines += [f"    {network} {caller.name};" for network in caller.settings.addresses]
        lines.append("}")
    lines += [
        "map $onnxpool_caller_found $onnxpool_caller {",
        "    default $onnxpool_caller_found;",
        f'    "" {ANONYMOUS};',
        "}",
        '# Its lane: the socket beside each pool\'s where its requests wait for a worker (lane 0: "").',
        f"map $onnxpool_caller_found {LANE_VARIABLE} {{",
        '    default "";',
    ]
    lines += [f"    {caller.name} _lane{caller.lane};" for caller in book.callers if caller.lane]
    lines += ["}", "map $onnxpool_caller_found $onnxpool_retry_after {", "    default 1;"]
    lines += [f"    {caller.name} {retry_after(caller)};" for caller in book.callers if caller.settings.rate]
    lines.append("}")
    for caller in book.callers:
        settings = caller.settings
        if settings.rate or settings.concurrency:
            lines += [
                f"# [caller.{caller.name}] quota, counted per model.",
                f"map $onnxpool_caller_found $onnxpool_quota_{_ident(caller)} {{",
                '    default "";',
                f'    {caller.name} "{caller.name}:{model}";',
                "}",
            ]
        if settings.rate:
            lines.append(
                f"limit_req_zone $onnxpool_quota_{_ident(caller)} zone=onnxpool_rate_{_ident(caller)}:1m "
                f"rate={_rate(settings.rate)};"
            )
        if settings.concurrency:
            lines.append(f"limit_conn_zone $onnxpool_quota_{_ident(caller)} zone=onnxpool_conn_{_ident(caller)}:1m;")
    lines += [
        "# Over quota: 429 in the route's API shape (OpenAI's error object on /v1/embeddings).",
        "map $uri $onnxpool_quota_body {",
        f'    default \'{{"error": "{QUOTA_MESSAGE}"}}\';',
        f'    ~^/v1/embeddings \'{{"error": {{"message": "{QUOTA_MESSAGE}", "type": "requests", '
        '"param": null, "code": "rate_limit_exceeded"}}\';',
        "}",
    ]
    return "\n".join(lines) + "\n"


def _ident(caller: Caller) -> str:
    return caller.name.replace(".", "_").replace("-", "_") + f"_{caller.lane}"


def quota_lines(book: CallerBook) -> list[str]:
    """server-level: the quotas (inherited by every location), refused with 429 (`error_page 429` answers)."""
    lines = []
    for caller in book.callers:
        settings = caller.settings
        if settings.rate:
            burst = f" burst={settings.burst} nodelay" if settings.burst else ""  # no burst: one request per 1/rate
            lines.append(f"    limit_req zone=onnxpool_rate_{_ident(caller)}{burst};")
        if settings.concurrency:
            lines.append(f"    limit_conn onnxpool_conn_{_ident(caller)} {settings.concurrency};")
    return [*lines, "    limit_req_status 429;", "    limit_conn_status 429;"]


def server_block(book: CallerBook, grpc: bool = False) -> str:
    """server-level: the quotas (inherited by every location) and the 429 page; `grpc`: the gRPC server's,
    whose refusal is RESOURCE_EXHAUSTED (grpc-status 8, a trailers-only reply) with the same message."""
    if not book.enabled:
        return ""
    lines = ["", "    # Callers' quotas ([caller.<name>] rate, burst, concurrency): 429, never the 503 of shedding."]
    lines += quota_lines(book)
    if grpc:
        lines += [
            "    error_page 429 = @onnxpool_grpc_quota;",
            "    location @onnxpool_grpc_quota {",
            "        default_type application/grpc;",
            "        add_header grpc-status 8 always;",
            f'        add_header grpc-message "{QUOTA_MESSAGE}" always;',
            "        add_header retry-after $onnxpool_retry_after always;",
            "        return 204;",
            "    }",
        ]
    else:
        lines += [
            "    error_page 429 @onnxpool_quota;",
            "    location @onnxpool_quota {",
            "        default_type application/json;",
            "        add_header Retry-After $onnxpool_retry_after always;",
            "        add_header X-Request-ID $onnxpool_request_id always;",
            "        return 429 $onnxpool_quota_body;",
            "    }",
        ]
    return "\n".join(lines) + "\n"


def proxy_headers(book: CallerBook, directive: str = "proxy_set_header") -> str:
    """In each proxying location: the caller nginx found, replacing any the client sent (`directive`:
    grpc_set_header in the gRPC server)."""
    if not book.enabled:
        return ""
    return f"        {directive} {CALLER_HEADER} $onnxpool_caller_found;\n"


def log_field(book: CallerBook) -> str:
    return " caller=$onnxpool_caller" if book.enabled else ""
