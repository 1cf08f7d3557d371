"""The response cache: a reply computed once is served again, by any worker of a host or by any host.

It knows nothing of HTTP servers, routes or tasks, and imports only the settings
(`[cache]`, `onnxpool.config.settings.CacheSettings`, declared once there). The HTTP
layer's data plane (`onnxpool.server.dataplane`, through `onnxpool.server.reply_cache`)
builds a key per request from the canonical bytes a task gives it, asks
`ResponseCache.lookup`, and on a miss computes the reply and hands it to
`ResponseCache.store_reply`. Everything here is off the request path's
failure modes: a broken or slow cache is a miss, never an error or a stall past a
short timeout. LMDB and Redis are imported here and nowhere else (an import contract
in pyproject.toml).

Modules, one topic each:

- `key`: the key (SHA-256 of model digest, settings fingerprint, endpoint, parameters, payload)
- `codec`: a stored reply and its framing, checked on the way back
- `control`: the request's Cache-Control / Pragma
- `policy`: `ResponseCache` (read, store, skip, the circuit breaker, counters), `prepare`, `open_cache`
- `backend`: the store protocol; `lmdb_store` and `redis_store` implement it

Lifecycle under gunicorn (pre-fork, `preload_app = True`)::

    # master, before forking (onnxpool.hooks, once per run folder):
    prepare(settings, run_dir / "cache")        # creates folder + empty LMDB store, opens nothing
    # each worker, AFTER fork (gunicorn `post_fork`: ReplyCache.open):
    cache = open_cache(settings, run_dir / "cache", on_event=metrics_hook)

Why open after fork: an LMDB environment (its memory map, the lock file's
reader slot and file descriptors) must not be used by a process that inherited
it across fork() (LMDB's documentation: "use an environment only in the
process which opened it"), and a Redis client's sockets would likewise be
shared by two processes. So the master only creates the files; every worker
opens its own environment. `LocalStore` checks the pid on every call and
refuses an environment inherited across fork.

What is in the key (see `cache_key`): the model file's digest, a fingerprint of
the pre/postprocessing settings (include the onnxpool version: a release that
changes the reply format must not serve an older format), the endpoint name and
its *effective* parameters (after defaults are applied), and the request's
payload bytes (for multipart: each image's bytes in order, never the boundary).
What is NOT in the key: echo-only fields, i.e. the v2 request `id` and the
`X-Request-ID` header. The caller puts those into the reply fresh on a hit (a v2
JSON reply's `id`, the `X-Request-ID` response header); so a reply body that
contains an echoed id must be stored *without* it and completed per request, or
the endpoint must not be cached. For v2 requests use `v2_request_payload` to
drop the `id` from the request before keying.

Stored values are whole replies with status 200 only (errors are never stored):
body bytes, content type and the few headers that must be replayed (e.g.
`Inference-Header-Content-Length`). They are framed by `encode_reply` (fixed
11-byte header, lengths, ASCII-checked header strings, then the body) and
`decode_reply` checks every length, so nothing from LMDB or Redis is ever
unpickled or trusted to be well-formed.

Backends:

* local (`url = ""`): LMDB in a folder on tmpfs, shared by all the workers of
  one host, memory-mapped into each. Readers never block and never wait for a
  writer; a put is one write transaction that also expires and evicts (the entries
  stored longest ago first), so a reader sees a whole value or none and the byte
  total stays within `max_bytes`. Chosen over SQLite and diskcache by measurement:
  see docs/RESPONSE_CACHE.md.
* Redis (`url = "redis://host:port/db"`): same keys under a prefix, TTL via
  `SET ... PX`, short connect/read timeouts, no client retries, and a circuit
  breaker: after an error every call is an instant miss/drop for
  `redis_cooldown_seconds`, then one call probes again; it recovers by itself.

Counters: `CacheStats` (per process) plus an optional `on_event(name, backend,
value)` hook for Prometheus; this module never imports prometheus_client.
"""
