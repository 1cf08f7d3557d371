"""Callers: who sends a request, each one's share of a model, its quota and the models it may use.

A caller is a backend that calls the server. It is named by its API key (the keys file's
`<caller> <key>` lines; a key of `[auth] api_keys`, or a key alone on a line, is a caller of
its own, `key-<first 8 hex of its SHA-256>`), or, without keys, by a header its backend or
an upstream gateway sets, or by its client address (`[callers] identify`). `[caller.<name>]`
tables give a caller a weight, the models it may use and its quota.

Each caller has a lane: its own listening socket beside the pool's (workers/lanes.py), to which
nginx sends its requests; a worker chooses between the lanes with waiting connections by fair
share. Lane 0 is the pool's own socket: requests from no known caller, probes and scrapes.
Callers are kept only as names and SHA-256 digests of their keys; a key is never written out.
This module does no I/O but reading the keys file.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from onnxpool.config.loader import ConfigError
from onnxpool.config.settings import CALLER_NAME, CallerSettings, CallersSettings, Settings

ANONYMOUS = "anonymous"
"""The caller of a request that names none known: lane 0, and this label in logs and metrics."""
CALLER_HEADER = "X-Onnxpool-Caller"
"""Set by onnxpool's nginx on every request it passes (the caller it found, never the client's own)."""


def lane_addresses(bind: str, lanes: int) -> tuple[str, ...]:
    """The addresses of lanes 1..lanes beside `bind`: unix `x.sock` -> `x.1.sock`..., TCP PORT -> PORT+1..."""
    if bind.startswith("unix:"):
        path = bind[len("unix:") :]
        stem, dot, suffix = path.rpartition(".")
        if not dot or "/" in suffix:
            stem, suffix = path, "sock"
        return tuple(f"unix:{stem}.{lane}.{suffix}" for lane in range(1, lanes + 1))
    host, _, port = bind.rpartition(":")
    if int(port) == 0:
        raise ValueError("callers' lanes need a fixed port in server.bind, not 0")
    if int(port) + lanes > 65535:
        raise ValueError(f"callers' lanes take ports {int(port) + 1}..{int(port) + lanes}: past 65535")
    return tuple(f"{host}:{int(port) + lane}" for lane in range(1, lanes + 1))


def key_digest(key: str | bytes) -> bytes:
    """SHA-256 of a key: all that is kept of it."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape") if isinstance(key, str) else key).digest()


def unnamed_caller(digest: bytes) -> str:
    """The caller a key without a name stands for."""
    return f"key-{digest.hex()[:8]}"


def read_keys_file(path: Path) -> list[tuple[str | None, str]]:
    """(caller or None, key) per line: `<key>` or `<caller> <key>`; blank lines and `#` comments skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"auth.api_keys_file {path} cannot be read: {exc}") from None
    entries: list[tuple[str | None, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        where = f"auth.api_keys_file {path} line {number}"
        if len(words) > 2:
            raise ConfigError(f"{where}: a line is `<key>` or `<caller> <key>`")
        name, key = (None, words[0]) if len(words) == 1 else (words[0], words[1])
        if name is not None and not CALLER_NAME.fullmatch(name):
            raise ConfigError(f"{where}: a caller's name is letters, digits, '_ . -' (not first), <= 63")
        if len(key) < 16 or not key.isprintable():
            raise ConfigError(f"{where}: keys need 16+ printable non-space chars")
        entries.append((name, key))
    if not entries:
        raise ConfigError(f"auth.api_keys_file {path} holds no key")
    return entries


@dataclass(frozen=True)
class Caller:
    """One known caller, as nginx and the workers see it."""

    name: str
    lane: int
    """1..[callers] lanes: its socket beside the pool's (0: no lanes, the pool's own socket)."""
    settings: CallerSettings

    def may_use(self, model: str, aliases: tuple[str, ...] = ()) -> bool:
        allowed = self.settings.models
        return not allowed or model in allowed or any(alias in allowed for alias in aliases)


@dataclass(frozen=True)
class CallerBook:
    """The known callers: by name, by key digest; their lanes; how a request names one."""

    settings: CallersSettings
    """`[callers]`: how a caller is known, the lanes, the hold."""
    lanes: int
    """[callers] lanes for the bind served ("auto" resolved)."""
    callers: tuple[Caller, ...]
    digests: tuple[tuple[bytes, str], ...]
    """identify = "key": (SHA-256 of a key, its caller) for every configured key."""

    @property
    def enabled(self) -> bool:
        """Callers are told apart: by key when there are keys, else by header or address."""
        return self.settings.identify != "key" or bool(self.digests)

    @property
    def lane_count(self) -> int:
        """Lanes beside the pool's socket (0 when callers are not told apart)."""
        return self.lanes if self.enabled else 0

    def get(self, name: str) -> Caller | None:
        return self._by_name.get(name)

    @cached_property
    def _by_name(self) -> dict[str, Caller]:  # once per book: `get` runs on every request
        return {caller.name: caller for caller in self.callers}

    def caller_of_key(self, presented: str) -> str | None:
        """The caller a presented key belongs to, or None; every digest is compared (no early exit)."""
        candidate = key_digest(presented)
        found: str | None = None
        for digest, name in self.digests:
            if hmac.compare_digest(candidate, digest):
                found = name
        return found

    def lane_weights(self) -> tuple[int, ...]:
        """Weight of each lane 0..lanes: the sum of its callers' weights (lane 0: 1, the anonymous)."""
        weights = [0] * (self.lane_count + 1)
        weights[0] = 1
        for caller in self.callers:
            weights[caller.lane] += caller.settings.weight
        return tuple(weight or 1 for weight in weights)


AUTO_LANES = 8
"""[callers] lanes = "auto" on a unix socket (a TCP bind takes no port unasked)."""


def lanes_for(callers: CallersSettings, bind: str) -> int:
    if callers.lanes == "auto":
        return AUTO_LANES if bind.startswith("unix:") else 0
    return callers.lanes


def caller_book(
    callers: CallersSettings,
    tables: dict[str, CallerSettings],
    api_keys: tuple[str, ...],
    keys_file: Path | None,
    bind: str = "unix:",
) -> CallerBook:
    """The callers of these settings (reads the keys file), for a server on `bind`; ConfigError names a
    mistake."""
    keyed: list[tuple[str | None, str]] = [(None, key) for key in api_keys]
    if keys_file is not None:
        keyed.extend(read_keys_file(keys_file))
    digests: dict[bytes, str] = {}
    for name, key in keyed:
        digest = key_digest(key)
        owner = name or unnamed_caller(digest)
        if digests.get(digest, owner) != owner:
            raise ConfigError(f"the same API key is given to callers {digests[digest]} and {owner}")
        digests[digest] = owner
    names = set(tables)
    if callers.identify == "key":
        names |= set(digests.values())
    elif callers.identify == "address":
        for name, table in tables.items():
            if not table.addresses:
                raise ConfigError(f'[caller.{name}] has no addresses (needed with [callers] identify = "address")')
    for name in tables:
        if not CALLER_NAME.fullmatch(name):
            raise ConfigError(f"[caller.{name}]: a caller's name is letters, digits, '_ . -' (not first), <= 63")
        if name == ANONYMOUS:
            raise ConfigError(f"[caller.{ANONYMOUS}] is the name of requests from no known caller")
    # Lanes in name order, wrapping: the same file gives every process the same lanes.
    lanes = lanes_for(callers, bind)
    known = tuple(
        Caller(name, 1 + index % lanes if lanes else 0, tables.get(name, CallerSettings()))
        for index, name in enumerate(sorted(names))
    )
    return CallerBook(callers, lanes, known, tuple(digests.items()) if callers.identify == "key" else ())


POOLS_BIND = "unix:"
"""What a several-models host's front door renders lanes for: its pools' unix sockets."""


def caller_book_of(settings: Settings, bind: str | None = None) -> CallerBook:
    """The callers of a whole settings object ([callers], [caller.*], [auth] keys), for a server on `bind`
    (default [server] bind)."""
    auth = settings.auth
    bind = settings.server.bind if bind is None else bind
    return caller_book(settings.callers, settings.caller, auth.api_keys, auth.api_keys_file, bind)
