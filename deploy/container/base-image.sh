#!/bin/sh
# Make the Dockerfile's base image, debian:bookworm-slim, on a machine that cannot
# pull from a registry: a minimal Debian 12 root filesystem from this machine's apt
# sources (mmdebstrap), imported into podman under that same name, so that
# `podman build --pull=never -t onnxpool .` finds it. Run as root (or under
# `podman unshare`). Needs: apt-get install mmdebstrap podman.
#
#   sh deploy/container/base-image.sh [TARBALL]
#
# TARBALL (default /var/cache/onnxpool-ci/bookworm-minbase.tar) is kept and
# reused; delete it to make a fresh one. deploy/container/ci_image.py runs this.
set -eu

tarball=${1:-/var/cache/onnxpool-ci/bookworm-minbase.tar}
image=docker.io/library/debian:bookworm-slim

# The apt sources to fetch from: this machine's (deb822 file first). Passed
# explicitly: without a terminal, mmdebstrap would otherwise read them from stdin.
sources=""
for candidate in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
    if [ -s "$candidate" ] && grep -q debian "$candidate"; then sources=$candidate; break; fi
done
[ -n "$sources" ] || { echo "base-image.sh: no Debian apt sources in /etc/apt" >&2; exit 1; }

if [ ! -s "$tarball" ]; then
    mkdir -p "$(dirname "$tarball")"
    # minbase + what debian:*-slim leaves out (manuals, docs except copyrights, locales).
    mmdebstrap --variant=minbase --quiet \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        bookworm "${tarball%.tar}.partial.tar" "$sources" </dev/null
    mv "${tarball%.tar}.partial.tar" "$tarball"
fi
podman import --change 'CMD ["bash"]' "$tarball" "$image"
