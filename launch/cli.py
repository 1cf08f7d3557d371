"""The `onnxpool` command: serve, config, nginx-config, nginx, routes, and the tools bench, limit, tune, quantize.

The entry point sits above every layer (docs/ARCHITECTURE.md): it may import any of them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from onnxpool.config.callers import caller_book_of
from onnxpool.config.loader import (
    ENV_CONFIG_FILE,
    ENV_HOST_DIR,
    ENV_POOL,
    SECRET_KEYS,
    ConfigError,
    LoadedSettings,
    config_file_named,
    config_path_from,
    load_settings,
)
from onnxpool.config.nginx import render_site, upstream_servers
from onnxpool.config.nginx_callers import needs_js
from onnxpool.server.auth import mask_key

# gunicorn's configuration is package data: found through the package, wherever it is installed.
GUNICORN_CONF = Path(__file__).resolve().with_name("gunicorn_conf.py")


def _serve(args: argparse.Namespace) -> int:
    """Replace this process with gunicorn running gunicorn.conf.py (same pid, same signals)."""
    config_file = config_path_from(args.config, os.environ).resolve()
    if _names_several_models(config_file) and not os.environ.get(ENV_POOL):
        # With $ONNXPOOL_POOL: one model of the file, served alone (a pod's model container).
        if args.workers or args.threads_per_worker:
            print("onnxpool: error: with several models, workers and threads are per model: "
                  "[models.<name>] workers / threads_per_worker", file=sys.stderr)  # fmt: skip
            return 1
        if args.bind:
            os.environ["ONNXPOOL_SERVER__BIND"] = args.bind
        from onnxpool.host.controller import serve_models

        return serve_models(config_file)
    env = dict(os.environ)
    # onnxruntime (1.2x+) sends usage telemetry and writes a device id and an event database
    # under $HOME/.cache/Microsoft unless told not to; a server has no business doing either.
    env.setdefault("ORT_DISABLE_TELEMETRY", "1")
    if args.config:
        env[ENV_CONFIG_FILE] = str(config_file_named(args.config).resolve())
    if args.bind:
        env["ONNXPOOL_SERVER__BIND"] = args.bind
    if args.workers:
        env["ONNXPOOL_SERVER__WORKERS"] = str(args.workers)
    if args.threads_per_worker:
        env["ONNXPOOL_SERVER__THREADS_PER_WORKER"] = str(args.threads_per_worker)
    # A file, not `python:onnxpool.gunicorn_conf`: gunicorn re-executes a config FILE on every HUP
    # (a module would stay cached), and that re-execution is what re-validates settings and model.
    argv = [sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF)]
    os.execve(sys.executable, argv, env)
    return 0  # not reached


def _names_several_models(config_file: Path) -> bool:
    """A settings file with `[models.<name>]` tables: `serve` runs a host (one pool per model + nginx)."""
    import tomllib

    try:
        with config_file.open("rb") as handle:
            return "models" in tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError):
        return False  # gunicorn's config load reports it, in one line


def _config(args: argparse.Namespace) -> int:
    """Print the effective settings and where each value came from; on a file with several models, the
    host's own and then each model's as its pool reads them."""
    try:
        loaded = load_settings(args.config)
        pools = {name: load_settings(args.config, pool=name) for name in loaded.settings.models}
    except ConfigError as exc:
        print(f"onnxpool: error: {exc}", file=sys.stderr)
        return 1
    print(f"# config file: {loaded.config_file}")
    links = loaded.service_links_line()
    if links:
        print(f"# {links}")
    if not pools:
        _print_sources(loaded)
        return 0
    print("# the host: its front door, budgets and the settings every model shares")
    _print_sources(loaded, skip=("model.", "task.", "models.", "tasks."))
    for name, view in pools.items():
        print(f"\n# model {name}: what its pool serves ([models.{name}], [tasks.{name}] over the shared sections)")
        _print_sources(view)
    return 0


def _print_sources(loaded: LoadedSettings, skip: tuple[str, ...] = ()) -> None:
    flat = loaded.settings.model_dump(mode="json")
    keys = [key for key in loaded.sources if not key.startswith(skip)]
    width = max((len(k) for k in keys), default=0)
    for key in keys:
        value: object = flat
        for part in key.split("."):
            assert isinstance(value, dict)
            value = value[part]
        if tuple(key.split(".")) in SECRET_KEYS and isinstance(value, list):
            value = [mask_key(str(item)) for item in value]  # keys never reach a terminal or a log
        print(f"{key:<{width}} = {value!r:<45} # {loaded.sources[key]}")


def _nginx_config(args: argparse.Namespace) -> int:
    """Write the nginx site for these settings (stdout, or --output)."""
    overrides: dict[str, object] = {}
    if args.listen:
        overrides["nginx.listen"] = args.listen
    if args.upstream:
        overrides["nginx.upstreams"] = args.upstream
    if args.server_name:
        overrides["nginx.server_name"] = args.server_name
    to_stdout = args.output in (None, "-")
    try:
        settings = load_settings(args.config, overrides=overrides).settings
        callers = caller_book_of(settings)
        if needs_js(callers) and to_stdout:
            raise ConfigError("callers named by their keys need callers.js beside the site: write it with -o FILE")
    except ConfigError as exc:
        print(f"onnxpool: error: {exc}", file=sys.stderr)
        return 1
    if to_stdout:
        sys.stdout.write(render_site(settings, callers=callers))
        return 0
    output = Path(args.output)
    try:
        from onnxpool.proxy import write_callers_script  # as `onnxpool nginx` below: imported when used

        script = write_callers_script(output.parent, callers)
        output.write_text(render_site(settings, callers=callers, script=str(script or "")), encoding="utf-8")
    except OSError as exc:
        print(f"onnxpool: error: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    if script is not None:
        print(
            f"wrote {script} (the callers' key digests; nginx needs its js module: libnginx-mod-http-js)",
            file=sys.stderr,
        )
    print(f"wrote {args.output} (upstreams: {', '.join(upstream_servers(settings))})", file=sys.stderr)
    return 0


def _nginx(args: argparse.Namespace) -> int:
    """Run nginx in the foreground in front of this onnxpool (the pod's nginx container)."""
    from onnxpool import proxy

    try:
        settings = load_settings(args.config).settings
    except ConfigError as exc:
        print(f"onnxpool: error: {exc}", file=sys.stderr)
        return 1
    if settings.models:
        # A pod whose models run in containers of their own (the zoo overlay): this is its front door.
        from onnxpool.host.pod_front_door import serve_front_door

        return serve_front_door(config_path_from(args.config, os.environ).resolve())
    if not settings.nginx.pidfile:
        print("onnxpool: error: set [nginx] pidfile (e.g. /run/onnxpool/nginx/nginx.pid): nginx's files go beside it",
              file=sys.stderr)  # fmt: skip
        return 1
    binary = proxy.nginx_binary()
    if binary is None:
        print("onnxpool: error: nginx is not installed (Debian: apt-get install nginx-light)", file=sys.stderr)
        return 1
    try:
        return proxy.run_nginx(settings, binary, reread=lambda: load_settings(args.config).settings)
    except OSError as exc:
        print(f"onnxpool: error: cannot write nginx's files beside {settings.nginx.pidfile}: {exc}", file=sys.stderr)
        return 1


def _routes(args: argparse.Namespace) -> int:
    """Replace this process with gunicorn running the host's routes (a pod's routes container)."""
    config_file = config_path_from(args.config, os.environ).resolve()
    if not _names_several_models(config_file):
        print(f"onnxpool: error: {config_file} names no [models.<name>]: the host's routes are for several models",
              file=sys.stderr)  # fmt: skip
        return 1
    host = os.environ.get(ENV_HOST_DIR)
    if not host:
        print(f"onnxpool: error: set ${ENV_HOST_DIR}: the run folder the pod's containers share", file=sys.stderr)
        return 1
    Path(host).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, ENV_CONFIG_FILE: str(config_file)}
    argv = [sys.executable, "-m", "gunicorn", "-c", "python:onnxpool.host.routes_conf"]
    os.execve(sys.executable, argv, env)
    return 0  # not reached


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnxpool", description="Serve an ONNX model over HTTP on CPUs.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the server (gunicorn + the configured model)")
    serve.add_argument(
        "--config",
        help=f"TOML settings file, or a shipped one by name, e.g. efficientnet-lite0-int8 "
        f"(default: ${ENV_CONFIG_FILE} or config/onnxpool.toml)",
    )
    serve.add_argument("--bind", help="override server.bind, e.g. 127.0.0.1:9000 or unix:/run/onnxpool.sock")
    serve.add_argument("--workers", type=int, help="override server.workers")
    serve.add_argument("--threads-per-worker", type=int, help="override server.threads_per_worker")
    serve.set_defaults(func=_serve)

    config = commands.add_parser("config", help="print the effective settings and their sources")
    config.add_argument("--config", help="TOML settings file")
    config.set_defaults(func=_config)

    # Argument declarations only; the measuring and quantizing code loads when its command runs.
    from onnxpool.measure import cli as bench_cli
    from onnxpool.measure import replay as replay_cli
    from onnxpool.quantize import cli as quantize_cli

    tools = (
        (
            "bench",
            "closed-loop load test of a running server, by concurrency",
            bench_cli.add_bench_arguments,
            bench_cli.bench_command,
        ),
        (
            "limit",
            "in-process throughput limit of a model here (no HTTP)",
            bench_cli.add_limit_arguments,
            bench_cli.limit_command,
        ),
        (
            "tune",
            "measure the worker layouts (several models: their budgets) and recommend (or --write) the best",
            bench_cli.add_tune_arguments,
            bench_cli.tune_command,
        ),
        (
            "replay",
            "send the requests of an [inference_log] folder to a server and print how its replies agree",
            replay_cli.add_replay_arguments,
            replay_cli.replay_command,
        ),
        (
            "quantize",
            "static INT8 of a float model, as accurate as a budget allows",
            quantize_cli.add_quantize_arguments,
            quantize_cli.quantize_command,
        ),
    )
    for name, help_text, add_arguments, command in tools:
        tool = commands.add_parser(name, help=help_text)
        add_arguments(tool)
        tool.set_defaults(func=command)

    nginx = commands.add_parser("nginx-config", help="write the nginx site for these settings (docs/DEPLOYING.md)")
    nginx.add_argument("--config", help="TOML settings file")
    nginx.add_argument("--listen", help="override nginx.listen, e.g. 80 or 127.0.0.1:8080")
    nginx.add_argument(
        "--upstream",
        action="append",
        metavar="ADDRESS",
        help="an onnxpool instance, HOST:PORT or unix:/path.sock (repeat; overrides nginx.upstreams)",
    )
    nginx.add_argument("--server-name", help="override nginx.server_name")
    nginx.add_argument("-o", "--output", help="file to write (default: stdout)")
    nginx.set_defaults(func=_nginx_config)

    front = commands.add_parser(
        "nginx",
        help="run nginx in the foreground in front of this onnxpool (its pod's second container), or in front "
        "of several models' containers (a file with [models.<name>]: the zoo pod's front door)",
    )
    front.add_argument("--config", help="TOML settings file (one model: [nginx] pidfile must be set)")
    front.set_defaults(func=_nginx)

    routes = commands.add_parser(
        "routes",
        help=f"answer the host's own routes for several models' containers (the zoo pod; ${ENV_HOST_DIR} shared)",
    )
    routes.add_argument("--config", help="TOML settings file with [models.<name>] tables")
    routes.set_defaults(func=_routes)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
