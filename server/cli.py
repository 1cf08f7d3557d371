"""The `onnxpool` command: serve, config (more subcommands register themselves here)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from config.loader import ENV_CONFIG_FILE, SECRET_KEYS, ConfigError, load_settings
from server.auth import mask_key

REPO_ROOT = Path(__file__).resolve().parents[1]
GUNICORN_CONF = REPO_ROOT / "gunicorn.conf.py"


def _serve(args: argparse.Namespace) -> int:
    """Replace this process with gunicorn running gunicorn.conf.py (same pid, same signals)."""
    env = dict(os.environ)
    if args.config:
        env[ENV_CONFIG_FILE] = str(Path(args.config).resolve())
    if args.bind:
        env["ONNXPOOL_SERVER__BIND"] = args.bind
    if args.workers:
        env["ONNXPOOL_SERVER__WORKERS"] = str(args.workers)
    if args.threads_per_worker:
        env["ONNXPOOL_SERVER__THREADS_PER_WORKER"] = str(args.threads_per_worker)
    if not GUNICORN_CONF.is_file():
        print(f"onnxpool: error: {GUNICORN_CONF} is missing (install onnxpool from its source tree)", file=sys.stderr)
        return 1
    argv = [sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF), "--chdir", str(REPO_ROOT)]
    os.execve(sys.executable, argv, env)
    return 0  # not reached


def _config(args: argparse.Namespace) -> int:
    """Print the effective settings and where each value came from."""
    try:
        loaded = load_settings(args.config)
    except ConfigError as exc:
        print(f"onnxpool: error: {exc}", file=sys.stderr)
        return 1
    flat = loaded.settings.model_dump(mode="json")
    print(f"# config file: {loaded.config_file}")
    width = max(len(k) for k in loaded.sources)
    for key, source in loaded.sources.items():
        value: object = flat
        for part in key.split("."):
            assert isinstance(value, dict)
            value = value[part]
        if tuple(key.split(".")) in SECRET_KEYS and isinstance(value, list):
            value = [mask_key(str(item)) for item in value]  # keys never reach a terminal or a log
        print(f"{key:<{width}} = {value!r:<45} # {source}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnxpool", description="Serve an ONNX model over HTTP on CPUs.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the server (gunicorn + the configured model)")
    serve.add_argument("--config", help=f"TOML settings file (default: ${ENV_CONFIG_FILE} or config/onnxpool.toml)")
    serve.add_argument("--bind", help="override server.bind, e.g. 127.0.0.1:9000 or unix:/run/onnxpool.sock")
    serve.add_argument("--workers", type=int, help="override server.workers")
    serve.add_argument("--threads-per-worker", type=int, help="override server.threads_per_worker")
    serve.set_defaults(func=_serve)

    config = commands.add_parser("config", help="print the effective settings and their sources")
    config.add_argument("--config", help="TOML settings file")
    config.set_defaults(func=_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
