# syntax=docker/dockerfile:1
# onnxpool container image: the wheel built from this checkout, installed into a
# virtual environment on a slim Debian base, plus Debian's nginx-light (the pod's
# second container runs it; a several-model host, the zoo pod, starts it itself) and
# nginx's js module: one image to build and scan. docs/DEPLOYING.md has
# the commands, including making the base image on a machine without a registry
# (deploy/container/base-image.sh).
#
#   podman build -t onnxpool .
#   podman run --rm -p 8000:8000 --read-only --read-only-tmpfs=false \
#     --tmpfs /run/onnxpool:rw,mode=1777,U onnxpool         # development: no nginx in front
#
# Behind a TLS-intercepting proxy pip needs that proxy's CA at build time, given
# as a build secret (never baked into a layer):
#   --secret id=host-ca,src=/etc/ssl/certs/ca-certificates.crt
#
# Your own model: mount its folder read-only at /models (model.onnx, labels.txt,
# readable by uid 10001); it is served, or refused with one line, never replaced
# by the demo. Or mount a whole settings file over /etc/onnxpool/onnxpool.toml.

# Any Debian 12 (bookworm) image whose python3 is 3.11 works; CI builds from a
# root filesystem it makes with mmdebstrap and imports under this same name.
ARG BASE_IMAGE=debian:bookworm-slim

# ---------------------------------------------------------------- build stage
FROM ${BASE_IMAGE} AS build

# Versions: the base pins the release (Debian 12, bookworm); each package is pinned
# to its upstream version and Debian revision, and the trailing `*` lets that
# package's security updates in (+deb12uN, +bN). Debian's archive keeps only the
# newest build of each, so an exact pin fails to build the day a security update
# replaces it (nginx-light 1.22.1-9+deb12u11 -> u12 did), and a build that keeps
# working by its cached layer ships the old, vulnerable package.
# apt-get clean: a base without Docker's apt hook (an mmdebstrap rootfs) would
# otherwise keep every downloaded .deb in this layer.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3=3.11.2-1* \
      python3-venv=3.11.2-1* \
      python3-pip=23.0.1+dfsg-1* \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1

WORKDIR /src

# The dependencies first, in their own layer: rebuilt only when the lock changes.
# deploy/container/requirements.lock pins every package setup.cfg's ranges
# resolve to, with hashes (`make lock` refreshes it); pip refuses anything else.
# A build secret "host-ca" (a CA bundle) is used for pip's TLS when given.
# The wheel's build tools (setuptools, wheel) are locked the same way and go into
# a venv of their own that never reaches the runtime stage.
COPY deploy/container/requirements.lock deploy/container/build-requirements.lock /src/
RUN --mount=type=secret,id=host-ca \
    if [ -s /run/secrets/host-ca ]; then export PIP_CERT=/run/secrets/host-ca; fi \
 && python3 -m venv /opt/onnxpool \
 && /opt/onnxpool/bin/pip install --require-hashes --only-binary=:all: -r /src/requirements.lock \
 && python3 -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes --only-binary=:all: -r /src/build-requirements.lock

# Then the wheel (its demo model, default onnxpool.toml and gunicorn config are
# package data) into the same venv, without dependencies: they are the locked
# ones above. The venv lives at the same path in the runtime stage.
COPY . /src
RUN --mount=type=secret,id=host-ca \
    if [ -s /run/secrets/host-ca ]; then export PIP_CERT=/run/secrets/host-ca; fi \
 && /opt/build/bin/pip wheel --no-deps --no-build-isolation -w /tmp/dist /src \
 && /opt/onnxpool/bin/pip install --no-deps /tmp/dist/onnxpool-*.whl \
 && /opt/onnxpool/bin/pip check \
 && /opt/onnxpool/bin/pip uninstall -y pip setuptools \
 && rm -rf /tmp/dist \
 && /opt/onnxpool/bin/python -c "import onnxpool.server, onnxpool.workers, onnxpool.config, onnxpool.models"

# -------------------------------------------------------------- runtime stage
FROM ${BASE_IMAGE} AS runtime

# python3 for onnxpool; nginx-light for the pod's nginx container (`onnxpool nginx`) and
# for the nginx a several-model host starts (`onnxpool serve` on a file with [models.<name>]
# tables: the zoo overlay); its js module (~1 MB) for such a host with several text-embedding
# models, whose nginx routes /v1/embeddings by the body's `model` (config/nginx/route_by_model.js).
# No apt lists or .deb files are left in the layer.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3=3.11.2-1* \
      nginx-light=1.22.1-9* \
      libnginx-mod-http-js=0.7.9-2* \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log

COPY --from=build /opt/onnxpool /opt/onnxpool
COPY deploy/container/onnxpool.toml /etc/onnxpool/onnxpool.toml

# /models: the demo model's files (package data) linked in; the image's settings
# (/etc/onnxpool/onnxpool.toml) serve /models/model.onnx, so a folder mounted
# over /models replaces the demo entirely. Found by name, wherever the package keeps it.
# /opt/onnxpool/models: the package's demo models folder (efficientnet-lite0, iris) by a
# fixed path, for settings that name several of them (the zoo and scale-out overlays).
RUN model="$(find /opt/onnxpool/lib -path '*/efficientnet-lite0/model.onnx' -print -quit)" \
 && test -n "$model" \
 && mkdir -p /run/onnxpool /models \
 && ln -s "$model" /models/model.onnx \
 && ln -s "$(dirname "$model")/labels.txt" /models/labels.txt \
 && test -s /models/labels.txt \
 && ln -s "$(dirname "$(dirname "$model")")" /opt/onnxpool/models \
 && test -s /opt/onnxpool/models/iris/model.onnx \
 && test -s /opt/onnxpool/models/iris/labels.txt \
 && chown 10001:10001 /run/onnxpool \
 && chmod 0700 /run/onnxpool

LABEL org.opencontainers.image.title="onnxpool" \
      org.opencontainers.image.description="ONNX model server: pre-fork gunicorn workers, one onnxruntime session each; nginx for its pod" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.onnxpool.models-mount="/models: mount your model here (read-only, readable by uid 10001): model.onnx, labels.txt" \
      io.onnxpool.writable="/run/onnxpool: the only path written at run time (tmpfs / emptyDir)"

# Everything written at run time goes under /run/onnxpool: onnxpool's per-run
# folder (Prometheus multiprocess files, validated model copy, heartbeats, the
# response cache), its unix socket in the pod, and nginx's pid, configuration and
# temp files (nginx/). TMPDIR and HOME point there too, so the root filesystem is
# mounted read-only with one tmpfs/emptyDir at this path. ORT_DISABLE_TELEMETRY:
# onnxruntime would otherwise write a device id and an event database under
# $HOME/.cache/Microsoft and try to send usage telemetry.
ENV PATH=/opt/onnxpool/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/run/onnxpool \
    TMPDIR=/run/onnxpool \
    ORT_DISABLE_TELEMETRY=1 \
    ONNXPOOL_CONFIG=/etc/onnxpool/onnxpool.toml \
    ONNXPOOL_SERVER__BIND=0.0.0.0:8000 \
    ONNXPOOL_SERVER__RUN_DIR=/run/onnxpool

USER 10001:10001
WORKDIR /run/onnxpool
EXPOSE 8000

# Exec form: `onnxpool serve` execs gunicorn in this same pid, so SIGTERM from
# `podman stop` / the kubelet reaches gunicorn's master, which stops accepting
# and lets in-flight requests finish within server.graceful_timeout (30 s).
# The pod's nginx container overrides this with `onnxpool nginx`.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/onnxpool/bin/onnxpool", "serve"]
CMD []
