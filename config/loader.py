"""Load settings: defaults < TOML file < `ONNXPOOL_<SECTION>__<KEY>` environment.

Also records where each effective value came from, for `onnxpool config`, and
turns pydantic's errors into one line that names the key, the value, its
source and what is allowed. The variables a platform writes under the same
prefix (Kubernetes' service links, docker's links) are told apart from settings
and ignored (`is_service_link`).
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from onnxpool.config.settings import Settings

ENV_PREFIX = "ONNXPOOL_"
ENV_CONFIG_FILE = "ONNXPOOL_CONFIG"
# Not a setting: read CPU flags from this file instead of /proc/cpuinfo (workers/cpu_fit.py).
ENV_CPUINFO = "ONNXPOOL_CPUINFO"
# Not settings: set by `onnxpool serve` on a file with several models for each pool it starts
# (onnxpool.host): which `[models.<name>]` this process serves, and the host's run folder.
ENV_POOL = "ONNXPOOL_POOL"
ENV_HOST_DIR = "ONNXPOOL_HOST_DIR"
NOT_SETTINGS = frozenset({ENV_CONFIG_FILE, ENV_CPUINFO, ENV_POOL, ENV_HOST_DIR})
CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG_FILE = CONFIG_DIR / "onnxpool.toml"
# Settings whose values are file paths: relative ones are resolved against the
# TOML file's folder (or, for env values, the current directory) at load time,
# so workers and tools never depend on the directory they were started from.
PATH_KEYS = (("model", "path"), ("auth", "api_keys_file"))
OLD_PATH_KEYS = (("model", "labels"),)  # MOVED_TO_TASK: resolved where it was written, then moved
PATH_LIST_KEYS = (("model", "cpu_variants"),)

Key = tuple[str, ...]
TASK_TABLE = "task"
"""`[task]`: the task's own settings, validated by the task's model (onnxpool.tasks.registry), not here."""
TASK_KEY: Key = ("model", "task")
MOVED_TO_TASK = ("labels", "input_name", "output_name", "postprocess", "top_k", "preprocess")
"""Keys `[model]` held before tasks had tables of their own: now the `[task]` table's (the image
task's, and `labels` of the tabular and text-classification tasks too). Still read from `[model]`,
with one warning line each, so settings files written for the old layout keep working."""
# Values never printed (config errors, `onnxpool config`): they are credentials.
SECRET_KEYS: frozenset[Key] = frozenset({("auth", "api_keys")})


class ConfigError(ValueError):
    """Settings could not be loaded; the message is one line meant for an operator."""


@dataclass(frozen=True)
class LoadedSettings:
    """Validated settings plus, per dotted key, where the value came from."""

    settings: Settings
    sources: dict[str, str] = field(default_factory=dict)
    config_file: Path | None = None
    warnings: tuple[str, ...] = ()
    """One line each, for the log at start (e.g. a key read from its old place)."""
    moved_to_task: frozenset[str] = frozenset()
    """`[task]` keys that were written in `[model]` (MOVED_TO_TASK): a task that has no such key ignores
    them, as every task but image classification always did."""
    task_path_bases: dict[str, Path] = field(default_factory=dict)
    """Per `[task]` key, the folder a relative path in it resolves against: the settings file's
    (the environment's: the current directory). The task's own model knows which keys are paths."""
    service_links: tuple[str, ...] = ()
    """`ONNXPOOL_*` variables taken for a platform's service links (`is_service_link`) and ignored."""

    def key_sources(self) -> dict[Key, str]:
        """`sources` keyed by key tuples, as error messages look them up."""
        return {tuple(dotted.split(".")): where for dotted, where in self.sources.items()}

    def service_links_line(self) -> str | None:
        """The one line (for the log at start) that names the variables ignored as service links, if any."""
        if not self.service_links:
            return None
        return (
            f"settings: ignored {', '.join(self.service_links)}: taken for a platform's service-link "
            f"variables (a Kubernetes Service or docker link named onnxpool...), not settings"
        )


def shipped_configs() -> list[str]:
    """Names of the settings files shipped with onnxpool (`onnxpool.toml` and presets)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def config_file_named(text: str | os.PathLike[str]) -> Path:
    """A settings file: a path, or the bare name of a shipped one (`efficientnet-lite0-int8`).

    A bare name (no folder, no suffix) that is not a file here selects the shipped
    `onnxpool/config/<name>.toml`; anything else is a path, as given.
    """
    path = Path(text)
    if path.exists() or path.suffix or len(path.parts) != 1:
        return path
    shipped = CONFIG_DIR / f"{path.name}.toml"
    return shipped if shipped.is_file() else path


def config_path_from(explicit: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> Path:
    """The config file to read: --config, else $ONNXPOOL_CONFIG, else config/onnxpool.toml."""
    if explicit:
        return config_file_named(explicit)
    if environ.get(ENV_CONFIG_FILE):
        return config_file_named(environ[ENV_CONFIG_FILE])
    return DEFAULT_CONFIG_FILE


def load_settings(
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    pool: str | None = None,
) -> LoadedSettings:
    """Read, merge and validate settings; raise ConfigError with a one-line message.

    A file with `[models.<name>]` tables serves several models: loaded as it is, it is the host's
    settings (`settings.models`); with `pool` (or $ONNXPOOL_POOL) it is what that model's pool
    serves, its `[models.<name>]` seen as `[model]` (`pool_view`)."""
    env = os.environ if environ is None else environ
    config_file = config_path_from(path, env).resolve()
    file_values = _read_toml(config_file)
    if MODELS_TABLE in file_values:
        pool = env.get(ENV_POOL) if pool is None else pool
        file_values = pool_view(file_values, pool, config_file) if pool else _host_view(file_values, config_file)
    env_values, service_links = _read_env(env)
    merged: dict[str, Any] = {}
    sources: dict[Key, str] = {}
    for key, value in _leaves(file_values):
        _assign(merged, key, _resolve_path(key, value, config_file.parent))
        if not isinstance(value, Mapping):  # an empty [table] is no value of its own
            sources[key] = f"file {config_file}"
    for key, (var, value) in env_values.items():
        _assign(merged, key, _resolve_path(key, value, Path.cwd()))
        sources[key] = f"env {var}"
    for dotted, value in (overrides or {}).items():
        key = tuple(dotted.split("."))
        _assign(merged, key, value)
        sources[key] = "override"
    warnings, moved = _move_task_keys(merged, sources)
    _resolve_default_paths(merged, sources)
    bases = {
        key[1]: (config_file.parent if where.startswith("file ") else Path.cwd())
        for key, where in sources.items()
        if len(key) > 1 and key[0] == TASK_TABLE
    }
    try:
        settings = Settings.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, merged, sources)) from None
    every_key = {key: "default" for key in _schema_keys(Settings)}
    every_key.update(sources)
    return LoadedSettings(
        settings=settings,
        sources={".".join(k): v for k, v in sorted(every_key.items())},
        config_file=config_file,
        warnings=tuple(warnings),
        moved_to_task=frozenset(key[1] for key, where in sources.items() if key[0] == TASK_TABLE and key in moved),
        task_path_bases=bases,
        service_links=service_links,
    )


MODELS_TABLE = "models"
TASKS_TABLE = "tasks"


def _host_view(values: dict[str, Any], config_file: Path) -> dict[str, Any]:
    """A several-model file as the host reads it: model paths resolved, `[model]`/`[task]` refused."""
    for table in ("model", TASK_TABLE):
        if table in values:
            raise ConfigError(
                f"config file {config_file}: [{table}] and [models.<name>] together; with several models "
                f"each has its own [models.<name>] (and [tasks.<name>]) table"
            )
    for key in ("workers", "threads_per_worker"):
        if key in values.get("server", {}):
            raise ConfigError(f"config file {config_file}: [server] {key} is per model with several models: "
                              f"set it in [models.<name>]")  # fmt: skip
    models = values[MODELS_TABLE]
    if not isinstance(models, dict) or not models:
        raise ConfigError(f"config file {config_file}: [models] names no model; add a [models.<name>] table")
    for name, entry in models.items():
        if isinstance(entry, dict):
            if "name" in entry:
                raise ConfigError(f"config file {config_file}: [models.{name}] name: not a key here, the table's "
                                  f"name is the model's name (and `aliases` adds other names)")  # fmt: skip
            for key in ("path", "cpu_variants"):
                if key in entry:
                    entry[key] = _resolve_path(("model", key), entry[key], config_file.parent)
    return values


def pool_view(values: Mapping[str, Any], name: str, config_file: Path | None = None) -> dict[str, Any]:
    """What the pool of model `name` serves from a several-model file: a one-model settings tree.

    `[models.<name>]` becomes `[model]` (named `name`), `[tasks.<name>]` becomes `[task]`, its
    `limits` table overrides `[limits]` (and its `inference_log` table `[inference_log]`), `cache = false`
    turns `[cache]` off for it, its workers and threads are `[server]`'s and its `bind` (and `grpc_bind`)
    the pool's address. The host's own keys (budget, traffic, optional) stay out: they are the host's
    plan (onnxpool.host).
    """
    from onnxpool.config.settings import HOST_ONLY_KEYS

    models = values.get(MODELS_TABLE, {})
    if not isinstance(models, Mapping) or name not in models:
        known = ", ".join(models) if isinstance(models, Mapping) else "none"
        raise ConfigError(f"config file {config_file}: no [models.{name}] (models: {known})")
    entry = dict(models[name])
    if "name" in entry:
        raise ConfigError(f"config file {config_file}: [models.{name}] name: the table's name is the model's name")
    view = {key: value for key, value in values.items() if key not in (MODELS_TABLE, TASKS_TABLE)}
    host = {key: entry.pop(key) for key in list(entry) if key in HOST_ONLY_KEYS}
    view["model"] = {**entry, "name": name}
    tasks = values.get(TASKS_TABLE, {})
    view[TASK_TABLE] = dict(tasks.get(name, {})) if isinstance(tasks, Mapping) else {}
    if host.get("limits"):
        view["limits"] = {**values.get("limits", {}), **host["limits"]}
    if host.get("inference_log"):
        view["inference_log"] = {**values.get("inference_log", {}), **host["inference_log"]}
    if host.get("cache") is False:
        view["cache"] = {**values.get("cache", {}), "enabled": False}
    server = dict(values.get("server", {}))
    for key in ("workers", "threads_per_worker"):
        if key in host:
            server[key] = host[key]
    if host.get("bind"):
        server["bind"] = host["bind"]
    # The file's [server] grpc_bind is the host's router's: a pool serves gRPC on its own address, if any.
    server["grpc_bind"] = host.get("grpc_bind", "")
    view["server"] = server
    return view


def _move_task_keys(merged: dict[str, Any], sources: dict[Key, str]) -> tuple[list[str], set[Key]]:
    """`[model]` keys of the old layout (MOVED_TO_TASK) moved into `[task]`, one warning line each.

    Value by value (`[model.preprocess] crop` becomes `[task.preprocess] crop`); a value already
    in `[task]` wins unless the old key came from a stronger source (the environment over a file).
    """
    model = merged.get("model")
    moved: set[Key] = set()
    if not isinstance(model, dict):
        return [], moved
    warnings = []
    for name in MOVED_TO_TASK:
        if name not in model:
            continue
        value = model.pop(name)
        leaves = (
            list(_leaves(value, ("model", name)))
            if isinstance(value, Mapping) and value
            else [(("model", name), value)]
        )
        for old, leaf in leaves:
            new: Key = (TASK_TABLE, *old[1:])
            where = sources.pop(old, "input")
            old_name, new_name = _dotted_key(old), _dotted_key(new)
            if new in sources and _strength(sources[new]) >= _strength(where):
                warnings.append(f"settings: {old_name} (from {where}) is ignored: {new_name} is set; remove it")
                continue
            _assign(merged, new, leaf)
            sources[new] = where
            moved.add(new)
            warnings.append(f"settings: {old_name} (from {where}) is now {new_name}: move it there")
    return warnings, moved


def _dotted_key(key: Key) -> str:
    """`[model] labels`, `[task.preprocess] crop`: a key as it is written in a settings file."""
    return f"[{'.'.join(key[:-1])}] {key[-1]}"


def _strength(source: str) -> int:
    """Which source wins: an override, then the environment, then a file."""
    return 3 if source == "override" else 2 if source.startswith("env ") else 1


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        shipped = ", ".join(shipped_configs())
        raise ConfigError(f"config file {path} does not exist (shipped configs, by name: {shipped})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None


def _parse_env_value(raw: str) -> Any:
    """Env values are TOML literals when they parse as one (4, true, [1, 2]), else strings."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _read_env(environ: Mapping[str, str]) -> tuple[dict[Key, tuple[str, Any]], tuple[str, ...]]:
    """The settings in `environ`, and the names of the variables ignored as service links."""
    known = set(_schema_keys(Settings))
    found: dict[Key, tuple[str, Any]] = {}
    links: list[str] = []
    for var, raw in environ.items():
        if not var.startswith(ENV_PREFIX) or var in NOT_SETTINGS:
            continue
        key = tuple(part.lower() for part in var[len(ENV_PREFIX) :].split("__"))
        moved = key[0] == "model" and len(key) > 1 and key[1] in MOVED_TO_TASK
        if key not in known and not moved and not (key[0] == TASK_TABLE and len(key) > 1):
            if is_service_link(var, raw, environ):  # only once it is no setting: a setting always wins
                links.append(var)
                continue
            same_section = [k for k in known if k[:-1] == key[:-1]] or [k[:1] for k in known]
            allowed = ", ".join(sorted({ENV_PREFIX + "__".join(k).upper() for k in same_section}))
            raise ConfigError(f"unknown setting in environment variable {var}; allowed: {allowed}")
        found[key] = (var, _parse_env_value(raw))
    return found, tuple(sorted(links))


# Service links. The kubelet gives every pod, for each Service of its namespace, variables named after
# the Service (upper-cased, `-` as `_`), and docker's --link the same for a linked container. A Service
# named `onnxpool` (or KServe's `onnxpool-demo-predictor`) puts them under our prefix: they are no
# settings, and must never stop a start. They are told apart from typos by their shape: a suffix the
# kubelet or docker writes after a name that can be a Service's, holding the value it writes there
# (ONNXPOOL_PORT=tcp://10.96.0.12:8000, never ONNXPOOL_PORT=8000: that one is still refused).
_LINK_OWNER = rf"{re.escape(ENV_PREFIX.rstrip('_'))}(?:_[A-Z0-9_]*[A-Z0-9])?"
"""The variables' prefix: a Service's name (a DNS label) upper-cased with `-` as `_`, here one of ours."""
_DOCKER_ALIAS = rf"(?P<alias>{re.escape(ENV_PREFIX.rstrip('_'))}(?:_[A-Z0-9_]*?[A-Z0-9])?)"
"""The same for docker's link alias, as short as it can be: `_ENV_` after it starts the linked container's names."""
_LINK_PORT = r"_PORT_(?P<number>[0-9]+)_(?P<proto>TCP|UDP|SCTP)"
"""`_PORT_8000_TCP`: one port of the Service (every port, as docker names an exposed port)."""
_LINK_URL = re.compile(r"(?P<proto>tcp|udp|sctp)://(?:\[(?P<ipv6>[^\]]+)\]|(?P<ipv4>[0-9.]+)):(?P<port>[0-9]+)")
"""What `_PORT` and `_PORT_<n>_<PROTO>` hold: Go's net.JoinHostPort of the Service's IP and port."""
_DOCKER_LINK_NAME = re.compile(r"/[^/]+/[^/]+")
"""What docker's `<ALIAS>_NAME` holds: /<this container>/<alias>."""

LinkCheck = Callable[[re.Match[str], str, Mapping[str, str]], bool]


def _is_ip(text: str, version: int | None = None) -> bool:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    return version is None or address.version == version


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and 0 < int(text) < 65536 and text == str(int(text))


def _is_link_url(value: str, proto: str | None = None, port: str | None = None) -> bool:
    """`tcp://10.96.0.12:8000` or `tcp://[fd00::12]:8000` (with this protocol and port, when given)."""
    url = _LINK_URL.fullmatch(value)
    if url is None or not _is_port(url["port"]):
        return False
    if proto is not None and (url["proto"] != proto.lower() or url["port"] != port):
        return False
    return _is_ip(url["ipv6"], 6) if url["ipv6"] is not None else _is_ip(url["ipv4"], 4)


def _is_docker_link(alias: str, environ: Mapping[str, str]) -> bool:
    """Docker linked a container as `alias` here: its `<ALIAS>_NAME` is set as docker sets it."""
    return _DOCKER_LINK_NAME.fullmatch(environ.get(f"{alias}_NAME", "")) is not None


# (name pattern, check of the value): what the kubelet writes (pkg/kubelet/envvars), then docker's own.
_SERVICE_LINKS: tuple[tuple[re.Pattern[str], LinkCheck], ...] = (
    (re.compile(rf"{_LINK_OWNER}_SERVICE_HOST"), lambda m, value, env: _is_ip(value)),
    (re.compile(rf"{_LINK_OWNER}_SERVICE_PORT(?:_[A-Z0-9_]+)?"), lambda m, value, env: _is_port(value)),
    (re.compile(rf"{_LINK_OWNER}_PORT"), lambda m, value, env: _is_link_url(value)),
    (re.compile(rf"{_LINK_OWNER}{_LINK_PORT}"), lambda m, value, env: _is_link_url(value, m["proto"], m["number"])),
    (re.compile(rf"{_LINK_OWNER}{_LINK_PORT}_PROTO"), lambda m, value, env: value == m["proto"].lower()),
    (re.compile(rf"{_LINK_OWNER}{_LINK_PORT}_PORT"), lambda m, value, env: value == m["number"]),
    (re.compile(rf"{_LINK_OWNER}{_LINK_PORT}_ADDR"), lambda m, value, env: _is_ip(value)),
    (re.compile(rf"{_LINK_OWNER}_NAME"), lambda m, value, env: _DOCKER_LINK_NAME.fullmatch(value) is not None),
    # the linked container's own environment: any name, any value, so only beside its link's `_NAME`
    (re.compile(rf"{_DOCKER_ALIAS}_ENV_.+"), lambda m, value, env: _is_docker_link(m["alias"], env)),
)


def is_service_link(var: str, value: str, environ: Mapping[str, str]) -> bool:
    """A variable the kubelet's service links or docker's links wrote, by its name and value."""
    for pattern, check in _SERVICE_LINKS:
        match = pattern.fullmatch(var)
        if match is not None and check(match, value, environ):
            return True
    return False


def _leaves(tree: Mapping[str, Any], prefix: Key = ()) -> Iterator[tuple[Key, Any]]:
    for name, value in tree.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, (*prefix, name))
        else:
            yield (*prefix, name), value


def _assign(tree: dict[str, Any], key: Key, value: Any) -> None:
    node = tree
    for part in key[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    if isinstance(value, Mapping) and isinstance(node.get(key[-1]), dict):
        return  # an empty [table] must not wipe values already merged into it
    node[key[-1]] = value


def _resolve_path(key: Key, value: Any, base: Path) -> Any:
    if key == TASK_KEY and isinstance(value, str):
        # `path/to/file.py:Class`: the file is relative to the settings file like every path
        file, sep, name = value.rpartition(":")
        if sep and file.endswith(".py") and not Path(file).expanduser().is_absolute():
            return f"{(base / Path(file).expanduser()).resolve()}:{name}"
        return value
    if (key in PATH_KEYS or key in OLD_PATH_KEYS) and isinstance(value, str) and value:
        candidate = Path(value).expanduser()
        return str(candidate if candidate.is_absolute() else (base / candidate).resolve())
    if key in PATH_LIST_KEYS and isinstance(value, list):
        return [_resolve_path(("model", "path"), item, base) for item in value]
    return value


def _resolve_default_paths(merged: dict[str, Any], sources: dict[Key, str]) -> None:
    """Defaults name the bundled demo model relative to this folder."""
    for key in PATH_KEYS:
        if key in sources:
            continue
        default = getattr(getattr(Settings(), key[0]), key[1])
        if default is not None:
            _assign(merged, key, str((CONFIG_DIR / default).resolve()))


def _schema_keys(model: type[BaseModel], prefix: Key = ()) -> Iterator[Key]:
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _schema_keys(annotation, (*prefix, name))
        else:
            yield (*prefix, name)


def _schema_key_of(loc: tuple[int | str, ...], root: type[BaseModel] = Settings) -> Key:
    """The longest prefix of a pydantic error location that is a settings key or section."""
    model: type[BaseModel] | None = root
    key: list[str] = []
    parts = iter(loc)
    for part in parts:
        if model is None or not isinstance(part, str):
            break
        key.append(part)
        info = model.model_fields.get(part)
        annotation = info.annotation if info else None
        entries = _table_of_sections(annotation)
        if entries is not None:  # `[models.<name>]`: the name, then that section's keys
            name = next(parts, None)
            if not isinstance(name, str):
                break
            key.append(name)
            model = entries
            continue
        is_section = isinstance(annotation, type) and issubclass(annotation, BaseModel)
        model = annotation if is_section else None  # type: ignore[assignment]
    return tuple(key)


def _table_of_sections(annotation: Any) -> type[BaseModel] | None:
    """The section type of a `dict[str, Section]` field (`models`), else None."""
    if typing.get_origin(annotation) is not dict:
        return None
    value = typing.get_args(annotation)[1]
    return value if isinstance(value, type) and issubclass(value, BaseModel) else None


def _lookup(tree: Mapping[str, Any], key: Key) -> Any:
    node: Any = tree
    for part in key:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _describe(exc: ValidationError, merged: Mapping[str, Any], sources: Mapping[Key, str]) -> str:
    return "invalid settings: " + describe_validation_error(exc, merged, sources)


def describe_validation_error(
    exc: ValidationError,
    merged: Mapping[str, Any],
    sources: Mapping[Key, str],
    root: type[BaseModel] = Settings,
    prefix: Key = (),
) -> str:
    """One line per problem: the dotted key, its value, where it came from, what is allowed.

    `root` is the model that was validated, found at `prefix` in the settings (a task's
    `[task]` table is validated by the task's own model, at ("task",)).
    """
    problems: dict[Key, list[str]] = {}
    for error in exc.errors():
        key = (*prefix, *_schema_key_of(error["loc"], root))
        if error["type"] == "extra_forbidden":
            section = key[len(prefix) : -1]
            owner = _section_model(section, root)
            hidden: frozenset[str] = getattr(owner, "NOT_KEYS", frozenset())
            allowed = ", ".join(key for key in owner.model_fields if key not in hidden) if owner else "?"
            where = sources.get(key, "input")
            problems.setdefault(key, []).append(f"unknown key (from {where}); allowed here: {allowed}")
            continue
        message = error["msg"].removeprefix("Value error, ")
        problems.setdefault(key, []).append(message)
    parts = []
    for key, messages in problems.items():
        dotted = ".".join(key) or "settings"
        if messages[0].startswith("unknown key") or not key:
            parts.append(f"{dotted}: {messages[0]}")
            continue
        value = "<hidden>" if key in SECRET_KEYS else _lookup(merged, key)
        where = sources.get(key, "default")
        parts.append(f"{dotted} = {value!r} (from {where}): {' or '.join(dict.fromkeys(messages))}")
    return "; ".join(parts)


def _section_model(section: Key, root: type[BaseModel] = Settings) -> type[BaseModel] | None:
    model: type[BaseModel] = root
    parts = iter(section)
    for part in parts:
        info = model.model_fields.get(part)
        annotation = info.annotation if info else None
        entries = _table_of_sections(annotation)
        if entries is not None:
            next(parts, None)
            model = entries
            continue
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model
