# syntax=docker/dockerfile:1
# onnxpool container image: the wheel built from this checkout, installed into a
# virtual environment on a slim Debian base. Build and run (docs/DEPLOYING.md):
#
#   docker build -t onnxpool .            # or: podman build -t onnxpool .
#   docker run --rm -p 8000:8000 --read-only --tmpfs /run/onnxpool:uid=10001,gid=10001 onnxpool
#
# Behind a TLS-intercepting proxy, give pip the CA bundle at build time only
# (never baked into a layer): --secret id=host-ca,src=/etc/ssl/certs/ca-certificates.crt
#
# Your own model: mount it read-only at /models and point onnxpool at it,
#   -v "$PWD/mymodel:/models:ro" -e ONNXPOOL_MODEL__PATH=/models/model.onnx \
#   -e ONNXPOOL_MODEL__LABELS=/models/labels.txt
# or mount a whole onnxpool.toml and set ONNXPOOL_CONFIG=/etc/onnxpool/onnxpool.toml.
# Without either, the demo model (efficientnet-lite0, package data) is served.

# Any Debian 12 (bookworm) image whose python3 is 3.11 works; CI builds from a
# root filesystem it makes with mmdebstrap and imports under this same name.
ARG BASE_IMAGE=debian:bookworm-slim

# ---------------------------------------------------------------- build stage
FROM ${BASE_IMAGE} AS build

# Versions pinned to Debian 12's; they change only with a Debian point release.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3=3.11.2-1+b1 \
      python3-venv=3.11.2-1+b1 \
      python3-pip=23.0.1+dfsg-1 \
 && rm -rf /var/lib/apt/lists/*

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1

WORKDIR /src

# The dependencies first, in their own layer: it is rebuilt only when setup.cfg
# changes, not on every source edit. The list is setup.cfg's install_requires.
# A build secret "host-ca" (a CA bundle) is used for pip's TLS when given.
COPY setup.cfg /src/setup.cfg
RUN --mount=type=secret,id=host-ca \
    if [ -s /run/secrets/host-ca ]; then export PIP_CERT=/run/secrets/host-ca; fi \
 && python3 -m venv /opt/onnxpool \
 && python3 -c "import configparser; c = configparser.ConfigParser(); c.read('setup.cfg'); print(c['options']['install_requires'])" > /tmp/requirements.txt \
 && /opt/onnxpool/bin/pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# Then the wheel (its demo model, default onnxpool.toml and gunicorn config are
# package data) into the same venv; its dependencies are already there. The
# venv lives at the same path in the runtime stage, so its scripts keep working.
COPY . /src
RUN --mount=type=secret,id=host-ca \
    if [ -s /run/secrets/host-ca ]; then export PIP_CERT=/run/secrets/host-ca; fi \
 && /opt/onnxpool/bin/pip wheel --no-deps -w /tmp/dist /src \
 && /opt/onnxpool/bin/pip install /tmp/dist/onnxpool-*.whl \
 && /opt/onnxpool/bin/pip uninstall -y pip setuptools \
 && rm -rf /tmp/dist \
 && /opt/onnxpool/bin/python -c "import onnxpool.server, onnxpool.workers, onnxpool.config, onnxpool.models"

# -------------------------------------------------------------- runtime stage
FROM ${BASE_IMAGE} AS runtime

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3=3.11.2-1+b1 \
 && rm -rf /var/lib/apt/lists/*

COPY --from=build /opt/onnxpool /opt/onnxpool

# /models: the demo model's files (package data) linked in, so a config saying
# /models/model.onnx (the Kubernetes ConfigMap does) serves the demo until you
# mount your own model over /models. Found by name, wherever the package keeps it.
RUN model="$(find /opt/onnxpool/lib -path '*/efficientnet-lite0/model.onnx' -print -quit)" \
 && test -n "$model" \
 && mkdir -p /run/onnxpool /models \
 && ln -s "$model" /models/model.onnx \
 && ln -s "$(dirname "$model")/labels.txt" /models/labels.txt \
 && test -s /models/labels.txt \
 && chown 10001:10001 /run/onnxpool \
 && chmod 0700 /run/onnxpool

LABEL org.opencontainers.image.title="onnxpool" \
      org.opencontainers.image.description="ONNX model server: pre-fork gunicorn workers, one onnxruntime session each" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.onnxpool.models-mount="/models: mount your model here (read-only) and set ONNXPOOL_MODEL__PATH / ONNXPOOL_MODEL__LABELS" \
      io.onnxpool.writable="/run/onnxpool: the only path written at run time (tmpfs / emptyDir)"

# Everything the server writes at run time (per-run folder, Prometheus
# multiprocess files, validated model snapshot, worker heartbeat files) goes
# under ONNXPOOL_SERVER__RUN_DIR; TMPDIR and HOME point there too, so the root
# filesystem can be mounted read-only with one tmpfs/emptyDir at this path.
ENV PATH=/opt/onnxpool/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/run/onnxpool \
    TMPDIR=/run/onnxpool \
    ONNXPOOL_SERVER__BIND=0.0.0.0:8000 \
    ONNXPOOL_SERVER__RUN_DIR=/run/onnxpool

USER 10001:10001
WORKDIR /run/onnxpool
EXPOSE 8000

# Exec form: `onnxpool serve` execs gunicorn in this same pid, so SIGTERM from
# `docker stop` / the kubelet reaches gunicorn's master, which stops accepting
# and lets in-flight requests finish within server.graceful_timeout (30 s).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/onnxpool/bin/onnxpool", "serve"]
CMD []
