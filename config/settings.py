"""The settings schema: every key onnxpool reads, with its default and its check.

Each field is declared once, here, with a docstring under it; the TOML file,
the environment overrides and `onnxpool config` all go through this schema.
This module does no I/O (the loader in `config.loader` reads files and env).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

Auto = Literal["auto"]


def _positive_or_auto(value: int | str) -> int | str:
    """workers, threads_per_worker: a positive count or "auto" ([server] and [models.<name>])."""
    if isinstance(value, int) and value < 1:
        raise ValueError('must be a positive integer or "auto"')
    return value


def _check_bind(value: str) -> str:
    """`HOST:PORT` or `unix:/path.sock` (server.bind, nginx.upstreams)."""
    if value.startswith("unix:"):
        if len(value) <= len("unix:"):
            raise ValueError("unix socket bind needs a path, e.g. unix:/run/onnxpool/onnxpool.sock")
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("must be HOST:PORT (e.g. 127.0.0.1:8000) or unix:/path.sock")
    return value


def _check_tcp(value: str) -> str:
    """`HOST:PORT` only (a gRPC address: a unix socket cannot be shared by several workers)."""
    if value.startswith("unix:") or _check_bind(value) != value:
        raise ValueError('must be HOST:PORT (e.g. 127.0.0.1:8001), or "" for no gRPC')
    return value


class Section(BaseModel):
    """Base of every section: unknown keys are errors, values are checked strictly."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ServerSettings(Section):
    """`[server]`: how gunicorn binds, how many processes, and their limits."""

    bind: str = "127.0.0.1:8000"
    """Address to listen on: `HOST:PORT` or `unix:/path/to.sock`."""

    workers: int | Auto = "auto"
    """Worker processes; "auto" = usable cores / threads_per_worker."""

    threads_per_worker: int | Auto = "auto"
    """onnxruntime intra-op threads (= cores) per worker; "auto" = 1, or usable cores / workers."""

    worker_class: Literal["sync", "gthread"] = "sync"
    """`sync` (one request at a time, right behind nginx) or `gthread` (keep-alive clients)."""

    http_threads: int = Field(default=4, ge=1, le=256)
    """Request threads per worker when worker_class = "gthread" (inference stays serialised)."""

    timeout: int = Field(default=30, ge=1)
    """Seconds a worker may be silent (e.g. stuck in one inference) before it is replaced."""

    graceful_timeout: int = Field(default=30, ge=0)
    """Seconds in-flight requests get to finish on SIGTERM / HUP."""

    keepalive: int = Field(default=5, ge=0)
    """Seconds to hold an idle keep-alive connection (gthread)."""

    max_requests: int = Field(default=0, ge=0)
    """Recycle a worker after this many requests (0 = never)."""

    max_requests_jitter: int = Field(default=0, ge=0)
    """Random extra requests before recycling, so workers do not restart together."""

    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    """Largest request body accepted; larger bodies get 413 before they are read."""

    backlog: int = Field(default=2048, ge=1)
    """Listen backlog: connections the kernel queues while every worker is busy."""

    spin: bool = False
    """Let onnxruntime's intra-op threads busy-wait between runs (lower latency, burns CPU)."""

    control_socket: str = ""
    """gunicorn 25+ control socket path for `gunicornc`; "" disables it (two instances never collide)."""

    pidfile: str = ""
    """Write the master's pid here ("" = no pidfile)."""

    budgets: Literal["auto", "cgroup", "nice"] = "auto"
    """Several models (`[models.<name>]`): how each model's budget (`cpus`) is held under contention.
    "cgroup": a cgroup per model with a CPU weight (cgroup v2 `cpu.weight` where the host delegates a
    cgroup, e.g. systemd `Delegate=yes`; v1 `cpu.shares` as root), refusing to start without one;
    "nice": a nice value per worker, scaled by the model's worker count; "auto": a cgroup when this
    host allows one, else nice values (docs/ARCHITECTURE.md, "Several models")."""

    docs: bool = True
    """Serve the API page (Swagger UI over /openapi.json, try-it-out included) at GET /docs; it needs no key."""

    run_dir: str = ""
    """Folder for everything the server writes while it runs (metrics files, validated model copies,
    worker heartbeats, the local response cache), in a per-run subfolder removed at exit; "" =
    $TMPDIR if set, else $XDG_RUNTIME_DIR or /dev/shm when it is a tmpfs with 1 GiB free, else
    the system temp dir. One writable folder (a tmpfs) is all a read-only root filesystem
    needs. Read at start, not on HUP."""

    grpc_bind: str = ""
    """Also serve the Open Inference Protocol over gRPC (`inference.GRPCInferenceService`, what
    tritonclient.grpc and KServe's stubs call, and `grpc.health.v1`) on this `HOST:PORT`, e.g.
    "127.0.0.1:8001"; "" = off. Every worker listens on it (SO_REUSEPORT: the kernel spreads new
    connections over them); a call runs through the same data plane as a REST request. A HUP's
    new workers listen on the address it reads."""

    _counts = field_validator("workers", "threads_per_worker")(_positive_or_auto)
    _bind = field_validator("bind")(_check_bind)

    @field_validator("grpc_bind")
    @classmethod
    def _grpc_address(cls, value: str) -> str:
        return value and _check_tcp(value)

    @field_validator("run_dir")
    @classmethod
    def _absolute_run_dir(cls, value: str) -> str:
        if value and not Path(value).is_absolute():
            raise ValueError('must be an absolute path, or "" to let the server choose')
        return value


class ModelSettings(Section):
    """`[model]`: the one model this server serves: its file, how its session is made, its task.

    Nothing here is a task's: what a request and a reply look like (labels, top_k, image
    preprocessing...) is the `[task]` table, checked by the task."""

    task: str = "auto"
    """What turns requests into the model's inputs and its outputs into replies: a built-in task
    (`image-classification`, `tabular`, `tensors`, `text-embedding`, `text-classification`) or
    your own, `package.module:Class` or `file.py:Class` (docs/TASKS.md). `auto`:
    image-classification when the model's first input is 4-D, else tensors. Its settings are
    the `[task]` table, checked by the task."""
    name: str = Field(default="efficientnet-lite0", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    """Name in URLs (/v2/models/{name}); letters, digits, `_ . -`."""

    aliases: tuple[str, ...] = ()
    """Other names clients may use for this model, in URLs and in a request body's `model` (an OpenAI
    client's): e.g. its Hugging Face id, `sentence-transformers/all-MiniLM-L6-v2`. Replies and metrics
    say `name`. Letters, digits, `_ . -` and `/`."""

    version: str = Field(default="1", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """Version reported in metadata and accepted in /versions/{v} URLs."""

    path: Path = Path("../models/efficientnet-lite0/model.onnx")
    """The .onnx file. Relative paths in the TOML file are relative to that file."""

    warmup_runs: int = Field(default=3, ge=0, le=1000)
    """Inferences each worker runs before it takes traffic (the first one is always slow)."""

    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"
    """onnxruntime graph optimisation level."""

    memory_arena: Literal["auto", "keep", "release"] = "auto"
    """onnxruntime's memory arena: "keep" holds the largest run's memory for the next run (fastest);
    "release" gives it back after every run and trims the C heap (the least memory, ~0.9x the speed
    of text models); "auto" keeps it while the worker stays within `memory_headroom_mb` of its size
    after warm-up, and past that gives the arena and the heap's free pages back once (after a
    request larger than the usual). Releasing after every run is not what bounds memory: glibc
    keeps the freed pages (docs/BENCHMARKS.md)."""

    memory_headroom_mb: int = Field(default=64, ge=1)
    """memory_arena = "auto": how far (MB) a worker's heap and arenas may grow past their size after
    warm-up before they are given back. MiniLM's largest run (512 padded tokens) needs ~25 MB."""

    share_weights: bool = True
    """true: the master writes the model, as onnxruntime optimises it, into the run folder with its
    weights in one data file that every worker maps, so a host holds them once, not once per worker
    (MiniLM: 29 MB private per worker instead of 114). false: every worker reads a byte copy of
    the model into its own memory (as onnxpool did before). The file at `path` is only ever read."""

    prepacking: bool = True
    """true: the kernels' prepacked weights (MatMul and Conv weights re-laid out for the CPU's matrix
    code) are made once, saved in the mapped copy (share_weights) and mapped too: full speed. false:
    no prepacking: a smaller copy and 0-2 MB less per worker, at 0.78x the speed of the image model,
    0.55x of its INT8 build, 0.94x of MiniLM (docs/BENCHMARKS.md)."""

    wide_threads: Annotated[int, Field(ge=2, le=4096)] | Literal["auto", "off"] = "auto"
    """A request that finds the model's other workers idle runs on their cores too: each worker keeps
    a second, wide session (built from the same mapped weights) whose intra-op threads are pinned to
    the other workers' cores, and a run takes it only while no other worker of the model is serving a
    request (workers/wide.py). Under load every worker stays on its own share. "auto": as many
    threads as the model's cores (workers x threads_per_worker, at most the usable cores); N: N
    threads (2 up to the model's cores); "off": one session per worker, as before. No effect with a
    single worker. In process on 2 cores a MiniLM run of 256 tokens took 15 ms wide against 29 ms on
    one core, the image model's 2.7-4.5 ms against 4.7-4.9 (docs/BENCHMARKS.md, "A lone request gets
    every idle core"); a worker keeps a few MB more private memory."""

    cpu_variants: list[Path] = Field(default_factory=list)
    """INT8 builds of the same model made by `onnxpool quantize` for one CPU family each
    (`--target avx512-vnni`, `avx2`): at start-up the master serves the first one made for THIS
    CPU's int8 kernels instead of `path` (then the portable build or FP32), and logs which and why."""

    cpu_mismatch: Literal["warn", "refuse"] = "warn"
    """An INT8 model made for VNNI on a CPU without VNNI (workers/cpu_fit.py): log one warning
    line and serve ("warn"), or refuse to start ("refuse")."""

    @field_validator("aliases")
    @classmethod
    def _alias_shapes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for alias in value:
            if not ALIAS_PATTERN.fullmatch(alias):
                raise ValueError(f"alias {alias!r}: letters, digits, '_ . -' and '/' only (not first), at most 128")
        if len(set(value)) != len(value):
            raise ValueError("an alias is listed twice")
        return value


MODEL_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
ALIAS_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./-]{0,127}")


class ModelEntry(ModelSettings):
    """`[models.<name>]`: one model of a host that serves several (`onnxpool serve` runs one pool of
    workers per model behind nginx, docs/ARCHITECTURE.md). Every `[model]` key but `name` (the
    table's name is the model's), plus the model's budget and what its pool takes from the shared
    sections. Its task's settings are `[tasks.<name>]`."""

    NOT_KEYS: ClassVar[frozenset[str]] = frozenset({"name"})
    """`[model]` keys that are not keys here (the table's name is the model's)."""

    cpus: float | Auto = "auto"
    """The model's budget: the cores' worth it keeps when every model is busy (its scheduler weight);
    idle neighbours lend it theirs. "auto" = workers x threads_per_worker when those are set, else an
    equal share of what the other budgets leave."""

    workers: int | Auto = "auto"
    """This model's worker processes; "auto" = enough to use every usable core (so that it can
    borrow idle ones), i.e. usable cores / threads_per_worker."""

    threads_per_worker: int | Auto = "auto"
    """onnxruntime intra-op threads per worker of this model; "auto" = 1 (or cores / workers)."""

    cache: bool = True
    """Use the response cache (`[cache]`) for this model's replies."""

    traffic: float = Field(default=1.0, gt=0)
    """This model's share of the requests, relative to the others' (`onnxpool tune` on this file
    sizes the budgets for this mix; its `--traffic` replaces it for a run)."""

    optional: bool = False
    """true: a missing model file is one line in the log and the other models serve (the zoo's
    MiniLM, built by `make minilm`); false: it stops the start like any settings error."""

    bind: str = ""
    """This model's pool's own address (`HOST:PORT` or `unix:/path.sock`), for an nginx of your
    own (`onnxpool nginx-config`); "" = a socket in the run folder that only the front door uses."""

    grpc_bind: str = ""
    """This model's pool's own gRPC address (`HOST:PORT`), where the host's gRPC router (on `[server]
    grpc_bind`) sends the calls that name it; "" = a loopback port the host chooses. Set it where the
    host does not start the pools itself (the zoo pod: a container per model)."""

    limits: dict[str, Any] = Field(default_factory=dict)
    """`[models.<name>.limits]`: `[limits]` keys that differ for this model (e.g. max_queue_ms)."""

    inference_log: dict[str, Any] = Field(default_factory=dict)
    """`[models.<name>.inference_log]`: `[inference_log]` keys that differ for this model (e.g. its own url)."""

    @field_validator("cpus")
    @classmethod
    def _positive_cpus(cls, value: float | str) -> float | str:
        if isinstance(value, float) and not 0 < value <= 4096:
            raise ValueError('must be a positive number of cores (e.g. 0.5, 2) or "auto"')
        return value

    _counts = field_validator("workers", "threads_per_worker")(_positive_or_auto)

    @field_validator("bind")
    @classmethod
    def _bind_shape(cls, value: str) -> str:
        return value and _check_bind(value)

    @field_validator("grpc_bind")
    @classmethod
    def _grpc_bind_shape(cls, value: str) -> str:
        return value and _check_tcp(value)


HOST_ONLY_KEYS = frozenset(set(ModelEntry.model_fields) - set(ModelSettings.model_fields))
"""`[models.<name>]` keys that are the host's (budget, cache, bind...), not the pool's `[model]`."""


class LimitsSettings(Section):
    """`[limits]`: bounds on what one request may ask for."""

    max_batch: int = Field(default=32, ge=1)
    """Largest batch (first dimension / number of images) one request may run."""

    max_queue_ms: int = Field(default=0, ge=0)
    """Shed (503) a request that waited longer than this before a worker took it (0 = off).

    The wait is known from `X-Request-Start` (set by nginx, or by the client); a
    client deadline (`X-Request-Timeout` header, v2 `timeout` parameter) sheds too.
    """

    max_elements: int = Field(default=64 * 1024 * 1024, ge=1)
    """Largest number of elements in one input tensor."""

    max_json_depth: int = Field(default=64, ge=2, le=1000)
    """Deepest nesting allowed in a JSON request body."""

    max_images: int = Field(default=16, ge=1)
    """Most images in one /classify request."""

    max_image_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    """Largest single uploaded image file."""

    max_image_pixels: int = Field(default=40_000_000, ge=1)
    """Largest width x height accepted; checked from the header, before decoding."""


class LoggingSettings(Section):
    """`[logging]`: one format for gunicorn's and the app's lines."""

    level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    """Log level of the master, the workers and the app."""

    format: Literal["text", "json"] = "text"
    """`text` (human) or `json` (one JSON object a line, for log shippers)."""

    access_log: bool = True
    """Log one line per request."""


def _check_nginx_token(value: str, what: str) -> str:
    """nginx config values are pasted into a file: no whitespace, `;`, braces or quotes."""
    if not value or re.search(r"[\s;{}'\"#]", value):
        raise ValueError(f"{what} must be one nginx token (no spaces, ';', braces, quotes or '#')")
    return value


class NginxSettings(Section):
    """`[nginx]`: what `onnxpool nginx-config` writes into the nginx site in front of onnxpool.

    Timeouts and the body limit are not repeated here: they follow `[server]`.
    """

    listen: str = "80"
    """nginx `listen` value: a port, `ADDR:PORT` or `[::]:PORT`."""

    server_name: str = "_"
    """nginx `server_name` ("_" = any host name)."""

    upstreams: tuple[str, ...] = ()
    """onnxpool instances to balance: `HOST:PORT` or `unix:/path.sock` each; empty = this host's server.bind."""

    keepalive: int = Field(default=16, ge=0)
    """Idle keep-alive connections each nginx worker keeps to the upstreams (0 = none)."""

    max_fails: int = Field(default=3, ge=0)
    """Failed attempts within fail_timeout after which nginx rests an upstream (0 = never)."""

    fail_timeout: int = Field(default=10, ge=1)
    """Seconds of the max_fails window, and how long a failed upstream rests."""

    next_upstream_tries: int = Field(default=3, ge=1)
    """Upstreams one request may be tried on (connection errors, 502, 503) before the client sees the error."""

    connect_timeout: int = Field(default=2, ge=1)
    """Seconds to connect to an upstream before trying the next (a powered-off host never refuses)."""

    access_log: str = "/var/log/nginx/onnxpool.access.log"
    """nginx access log of this site ("" = off)."""

    client_timeout: int = Field(default=10, ge=1)
    """Seconds nginx waits for the next piece of a client's request header or body, and for a
    client to take the next piece of a reply (client_header_timeout, client_body_timeout,
    send_timeout); a client that stalls longer gets 408 / is closed. nginx buffers the whole
    request before onnxpool sees it, so a slow client holds only an nginx connection."""

    grpc_listen: str = ""
    """nginx `listen` value of the site's gRPC server (HTTP/2 cleartext, `grpc_pass` to the
    instances' `[server] grpc_bind`), e.g. "8001"; "" = no gRPC in the site. Needs
    `grpc_upstreams` or `[server] grpc_bind`."""

    grpc_upstreams: tuple[str, ...] = ()
    """onnxpool instances' gRPC addresses to balance (`HOST:PORT` each, their `[server] grpc_bind`);
    empty = this host's server.grpc_bind."""

    pidfile: str = ""
    """Only for `onnxpool nginx` (nginx in the same pod or host as this instance): nginx's pid
    file; its rendered configuration and temp folders go beside it. An onnxpool master with
    this set keeps serving on SIGTERM until the file is gone, i.e. until nginx has finished
    its requests (at most server.graceful_timeout), then drains as usual. "" = not used."""

    @field_validator("listen", "grpc_listen", mode="before")
    @classmethod
    def _port_alone(cls, value: object) -> object:
        # ONNXPOOL_NGINX__LISTEN=8000 arrives as the number 8000: a port alone is a valid listen.
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("listen", "server_name")
    @classmethod
    def _one_token(cls, value: str) -> str:
        return _check_nginx_token(value, "value")

    @field_validator("grpc_listen")
    @classmethod
    def _grpc_listen(cls, value: str) -> str:
        return value and _check_nginx_token(value, "value")

    @field_validator("access_log")
    @classmethod
    def _log_path(cls, value: str) -> str:
        return value and _check_nginx_token(value, "access_log")

    @field_validator("pidfile")
    @classmethod
    def _absolute_pidfile(cls, value: str) -> str:
        if value and not Path(value).is_absolute():
            raise ValueError('must be an absolute path, or "" (not used)')
        return value and _check_nginx_token(value, "pidfile")

    @field_validator("upstreams", "grpc_upstreams")
    @classmethod
    def _upstream_shapes(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        check = _check_tcp if info.field_name == "grpc_upstreams" else _check_bind  # gRPC: TCP only
        for item in value:
            _check_nginx_token(item, f"upstream {item!r}")
            check(item)
        return value


class AuthSettings(Section):
    """`[auth]`: optional API keys (`Authorization: Bearer <key>`); off while no key is set."""

    api_keys: tuple[str, ...] = ()
    """Accepted API keys. Empty (and no api_keys_file) = access control off."""

    api_keys_file: Path | None = None
    """File with one API key per line (blank lines and `#` comments ignored), added to api_keys."""

    protect_metrics: bool = True
    """Require a key for /metrics too; set false when Prometheus scrapes from inside the network."""

    @field_validator("api_keys_file", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("api_keys")
    @classmethod
    def _usable_keys(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for key in value:
            if len(key) < 16 or not key.isprintable() or any(c.isspace() for c in key):
                raise ValueError("each API key must be at least 16 printable characters without spaces")
        return value


CALLER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
"""A caller's name (config/callers.py): a Prometheus label value and an nginx token."""


class CallersSettings(Section):
    """`[callers]`: how a request's caller is known, and how workers share a model between callers."""

    identify: Literal["key", "header", "address"] = "key"
    """What names a caller: "key" (its API key: the keys file's `<caller> <key>` lines, each key of
    [auth] api_keys a caller of its own; off while there is no key), "header" (the value of
    `header`, set by the calling backend or a gateway you trust), "address" (the client address
    nginx sees, in a `[caller.<name>] addresses` network)."""

    header: str = "X-Caller"
    """identify = "header": the request header naming the caller."""

    lanes: int | Auto = "auto"
    """Sockets per model for callers, beside its own (callers beyond them share lanes): a unix
    `x.sock` adds `x.1.sock`..., a TCP bind PORT adds PORT+1..PORT+lanes. "auto": 8 on a unix
    socket, none on a TCP port (no port is taken unasked: set it to share a model fairly there;
    callers are still named, counted, held to quotas and models). 0 = none."""

    @field_validator("lanes")
    @classmethod
    def _lane_count(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 0 <= value <= 64:
            raise ValueError('must be 0..64 or "auto"')
        return value

    hold_ms: float = Field(default=3.0, ge=0, le=100)
    """How long a free worker keeps itself for a caller below its share that has just been
    answered, rather than take more work of a caller at or above its share (0 = never)."""

    @field_validator("header")
    @classmethod
    def _header_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", value):
            raise ValueError("must be an HTTP header name (letters, digits, '-')")
        return value


class CallerSettings(Section):
    """`[caller.<name>]`: one caller's share, models and quota (every key optional)."""

    weight: int = Field(default=1, ge=1, le=100)
    """Its share of a busy model's workers, against the other active callers' weights."""

    models: tuple[str, ...] = ()
    """The models it may call (names as in [models] or [model]); empty = every model. Others: 403."""

    rate: float = Field(default=0, ge=0)
    """Requests per second it may send to each model (0 = no limit); more: 429 with Retry-After."""

    burst: int = Field(default=0, ge=0)
    """Requests beyond `rate` it may send at once before the 429s begin."""

    concurrency: int = Field(default=0, ge=0)
    """Its requests in flight at one model at once (0 = no cap); more: 429."""

    addresses: tuple[str, ...] = ()
    """identify = "address": its client networks (`10.1.0.0/16`, `192.0.2.7`)."""

    @field_validator("addresses")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an address or network (CIDR)") from None
        return value


class MetricsSettings(Section):
    """`[metrics]`: Prometheus metrics on /metrics and the Server-Timing header."""

    enabled: bool = True
    """Record Prometheus metrics in every worker and serve them, summed over workers, on GET /metrics."""

    dir: str = ""
    """Folder for the per-process metric files; "" = a fresh temporary folder per run, removed at exit.
    A given folder is emptied when the master starts (use a tmpfs, e.g. systemd's RuntimeDirectory)."""

    server_timing: bool = True
    """Add a `Server-Timing` header (queue, decode, infer, encode, total in ms) to every reply."""

    @field_validator("dir")
    @classmethod
    def _absolute_dir(cls, value: str) -> str:
        if value and not Path(value).is_absolute():
            raise ValueError('must be an absolute path, or "" for a fresh temporary folder per run')
        return value


class CacheSettings(Section):
    """`[cache]`: the response cache (a repeated request is answered without decoding or inference).

    The key covers the model file's digest, the model settings, the endpoint and its
    parameters and the request's image/tensor bytes, so a reload to another model or other
    settings never serves an old answer. Read per generation (HUP); docs/DEPLOYING.md sizes it.
    """

    enabled: bool = True
    """Cache successful replies of /predict, /classify and binary-tensor v2 infer."""

    url: str = ""
    """"" = LMDB in the run folder, shared by the workers of this host; `redis://host:port/db`
    (or rediss://, unix://) = one Redis shared by several hosts (bound it with Redis' maxmemory)."""

    max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    """Local cache size (keys + replies); the least recently stored entries make room."""

    max_entry_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Replies larger than this are served but not stored."""

    ttl_seconds: float = Field(default=3600.0, gt=0)
    """How long an entry lives (local and Redis)."""

    redis_connect_timeout_seconds: float = Field(default=0.05, gt=0, le=10)
    """Longest wait to connect to Redis; a request then computes its reply."""

    redis_timeout_seconds: float = Field(default=0.1, gt=0, le=10)
    """Longest wait for one Redis read or write; a request then computes its reply."""

    redis_cooldown_seconds: float = Field(default=5.0, ge=0)
    """After a Redis error each worker skips Redis this long, then tries again (recovers by itself)."""

    @property
    def backend_name(self) -> str:
        """`local` (LMDB) or `redis`: a label of the cache's metrics."""
        return "redis" if self.url else "local"

    @field_validator("url")
    @classmethod
    def _url_scheme(cls, value: str) -> str:
        if value and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError('must be "" (local cache) or a redis://, rediss:// or unix:// URL')
        return value


class TracingSettings(Section):
    """`[tracing]`: OpenTelemetry traces of the requests the workers answer, sent over OTLP/HTTP.

    Off unless an endpoint is given (here, or by `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). Each worker
    makes its own exporter after fork and flushes it as it exits; a collector that is down costs
    requests nothing (its spans are dropped and counted in /metrics). docs/DEPLOYING.md, "Tracing".
    """

    endpoint: str = ""
    """The collector's OTLP/HTTP base URL, e.g. "http://127.0.0.1:4318" (Jaeger, Tempo, the OpenTelemetry
    Collector); `/v1/traces` is appended as the OTLP spec says (a URL already ending in it is used as it
    is). "" = `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` if set (a full URL, used as it is), else tracing is off."""

    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """The share of the traces this server starts that are recorded (a request without a `traceparent`);
    a request with one is recorded as its caller decided (a parent-based sampler)."""

    service_name: str = Field(default="", max_length=128)
    """`service.name` of the spans; "" = `OTEL_SERVICE_NAME` if set, else the model's name (with several
    models, each model's pool is its own service unless a name is set here for the whole host)."""

    flush_timeout_seconds: float = Field(default=2.0, gt=0, le=60)
    """How long a worker that exits (TERM, a HUP's replacement, max_requests) waits for its last spans to
    reach the collector; past it, they are dropped (and counted)."""

    @field_validator("endpoint")
    @classmethod
    def _endpoint_url(cls, value: str) -> str:
        return value and check_otlp_url(value)


NEVER_LOGGED_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key", "x-auth-token"}
)
"""Request headers `[inference_log] headers` refuses: credentials (API keys travel as `Authorization`)."""


class InferenceLogSettings(Section):
    """`[inference_log]`: every request and reply of the model (or a sample), as KServe's logger writes them.

    Off unless `url` or `path` is set. Each worker buffers events in memory (at most `max_bytes`) and
    one thread of its own, made after fork, sends them after the replies have left: a sink that is
    down or slow drops events (counted in /metrics), never a request. docs/DEPLOYING.md, "Inference log".
    With several models, `[models.<name>.inference_log]` overrides these keys for one model.
    """

    url: str = ""
    """An HTTP(S) CloudEvents sink (a Knative broker, KServe's message-dumper): each request and reply is
    POSTed as a binary-mode CloudEvent, KServe's `org.kubeflow.serving.inference.request`/`.response`."""

    path: str = ""
    """A folder: each worker writes JSON lines there, one record per request holding both sides."""

    format: Literal["jsonl", "parquet"] = "jsonl"
    """`path`'s files: JSON lines, or Parquet (a row per request; needs pyarrow: `pip install onnxpool[parquet]`)."""

    mode: Literal["all", "request", "response"] = "all"
    """What is logged: both sides, the request only, or the reply only (KServe's logger modes)."""

    sample: float = Field(default=1.0, ge=0.0, le=1.0)
    """The share of requests logged (each request drawn at random; 1.0 = every one)."""

    headers: tuple[str, ...] = ()
    """Request headers sent along as the events' `metadata` (KServe's `metadataHeaders`); never a
    credential (Authorization, cookies, API keys are refused)."""

    failures: bool = True
    """Log refused and failed replies too (4xx, 5xx), with their status; false = 200s only (KServe's way)."""

    max_bytes: int = Field(default=16 * 1024 * 1024, ge=64 * 1024, le=4 * 1024**3)
    """Memory for events not yet sent, per worker; a new event that does not fit is dropped (and counted)."""

    flush_seconds: float = Field(default=1.0, gt=0, le=300)
    """Longest time an event waits in the buffer before it is sent or written."""

    timeout_seconds: float = Field(default=5.0, gt=0, le=120)
    """Longest wait for the sink to take one event (then it is retried, then counted as failed)."""

    retries: int = Field(default=2, ge=0, le=10)
    """Attempts after the first for an event the sink refused (5xx) or could not be reached for, with back-off."""

    rotate_bytes: int = Field(default=64 * 1024 * 1024, ge=4096)
    """`path`: a worker starts a new file once its current one holds this many bytes."""

    rotate_seconds: float = Field(default=3600.0, gt=0)
    """`path`: ... or once it has been open this long."""

    tensor_elements: int = Field(default=16384, ge=0)
    """`path`: a v2 tensor of more elements than this (an image's pixels) is recorded as its name, datatype,
    shape and its data's sha256 and size, not its data (the CloudEvents sink always gets the body as sent)."""

    service: str = Field(default="", max_length=253)
    """`ce-inferenceservicename`; "" = the model's name."""

    namespace: str = Field(default="", max_length=253)
    """`ce-namespace`; "" = `$POD_NAMESPACE` (the Kubernetes downward API, deploy/k8s sets it), else ""."""

    component: str = Field(default="predictor", max_length=253)
    """`ce-component` (KServe: predictor, transformer or explainer)."""

    endpoint: str = Field(default="", max_length=253)
    """`ce-endpoint` (KServe: default or canary); "" = `$ONNXPOOL_ENDPOINT`, else "default"."""

    source: str = Field(default="", max_length=1024)
    """`ce-source`; "" = `$POD_NAME`, else `$HOSTNAME` (a pod's name), else this host's name."""

    @property
    def enabled(self) -> bool:
        return bool(self.url or self.path)

    @field_validator("url")
    @classmethod
    def _sink_url(cls, value: str) -> str:
        try:
            return value and check_otlp_url(value)
        except ValueError:
            raise ValueError('must be an http:// or https:// URL with a host, e.g. "http://broker.ns.svc/"') from None

    @field_validator("path")
    @classmethod
    def _absolute_path(cls, value: str) -> str:
        if value and not Path(value).is_absolute():
            raise ValueError('must be an absolute folder, or "" for no files')
        return value

    @field_validator("headers")
    @classmethod
    def _no_credentials(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
                raise ValueError(f"{name!r} is not a header name")
            if name.lower() in NEVER_LOGGED_HEADERS:
                raise ValueError(f"{name!r} carries credentials and is never logged")
        return value

    @model_validator(mode="after")
    def _one_sink(self) -> InferenceLogSettings:
        if self.url and self.path:
            raise ValueError("set url (a CloudEvents sink) or path (a folder of files), not both")
        if self.format == "parquet" and not self.path:
            raise ValueError('format = "parquet" is for files: set path')
        return self


def check_otlp_url(value: str) -> str:
    """An OTLP/HTTP URL: http:// or https://, a host, no query or fragment (the endpoint settings)."""
    match = re.fullmatch(r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:\d{1,5})?(/[^\s?#]*)?", value)
    if match is None:
        raise ValueError('must be an http:// or https:// URL with a host, e.g. "http://127.0.0.1:4318"')
    if match.group(2) is not None and not 0 < int(match.group(2)[1:]) <= 65535:
        raise ValueError("the port must be 1..65535")
    return value


class Settings(Section):
    """All of onnxpool's settings."""

    server: ServerSettings = ServerSettings()
    model: ModelSettings = ModelSettings()
    limits: LimitsSettings = LimitsSettings()
    logging: LoggingSettings = LoggingSettings()
    nginx: NginxSettings = NginxSettings()
    auth: AuthSettings = AuthSettings()
    callers: CallersSettings = CallersSettings()
    caller: dict[str, CallerSettings] = Field(default_factory=dict)
    """`[caller.<name>]`: the named callers' weights, models and quotas (config/callers.py)."""
    metrics: MetricsSettings = MetricsSettings()
    cache: CacheSettings = CacheSettings()
    tracing: TracingSettings = TracingSettings()
    inference_log: InferenceLogSettings = InferenceLogSettings()
    task: dict[str, Any] = Field(default_factory=dict)
    """`[task]`: the settings of `[model] task`, validated by the task's own model when it is built."""
    models: dict[str, ModelEntry] = Field(default_factory=dict)
    """`[models.<name>]`: the models of a host that serves several (each pool sees its own as
    `[model]`, config.loader); empty = this file serves `[model]` alone."""
    tasks: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """`[tasks.<name>]`: the `[task]` table of each of `[models]`."""

    @model_validator(mode="after")
    def _several_models(self) -> Settings:
        names: dict[str, str] = {}
        for name, entry in self.models.items():
            if not MODEL_NAME_PATTERN.fullmatch(name):
                raise ValueError(f"[models.{name}]: a model name is letters, digits, '_ . -' (not first), <= 128")
            for known in (name, *entry.aliases):
                if names.get(known, name) != name:
                    raise ValueError(f"[models.{name}]: the name {known!r} is already {names[known]}'s")
                names[known] = name
        if self.nginx.grpc_listen and not (self.nginx.grpc_upstreams or self.server.grpc_bind):
            raise ValueError(
                "[nginx] grpc_listen: nginx needs the instances' gRPC addresses: set [server] "
                "grpc_bind or [nginx] grpc_upstreams"
            )
        for name in self.tasks:
            if name not in self.models:
                raise ValueError(f"[tasks.{name}] names no model (models: {', '.join(self.models) or 'none'})")
        return self
