#!/bin/sh
# Make the daemonless container tools available for `make image` and the container test:
# mmdebstrap (the local stand-in base image), buildah (build), podman + runc (run), uidmap and the
# CNI plugins podman needs. They come from Debian's packages. Where a Docker engine answers
# (`docker info`), nothing is installed: `make image` uses `docker build` there.
# When every tool is already on PATH this does nothing.
set -eu

TOOLS="mmdebstrap buildah podman runc"
PACKAGES="mmdebstrap buildah podman runc uidmap containernetworking-plugins"

missing=""
for tool in $TOOLS; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
[ -z "$missing" ] && exit 0

if [ "${CONTAINER_ENGINE:-}" = docker ] || { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }; then
    exit 0
fi

fail() {
    echo "ensure-container-tools: $*" >&2
    echo "ensure-container-tools: install Debian's packages ($PACKAGES) or run a Docker engine," >&2
    echo "ensure-container-tools: then run again." >&2
    exit 1
}

command -v apt-get >/dev/null 2>&1 || fail "missing:$missing, and apt-get is not available"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || fail "missing:$missing, and installing them needs root (no sudo)"
    SUDO="sudo -n"
fi

echo "ensure-container-tools: installing$missing (apt-get: $PACKAGES)" >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null || fail "apt-get update failed"
# podman recommends crun and others; only what is named is installed (runc is the runtime used).
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold $PACKAGES >/dev/null ||
    fail "apt-get install failed"

for tool in $TOOLS; do
    command -v "$tool" >/dev/null 2>&1 || fail "the packages installed but '$tool' is not on PATH"
done
echo "ensure-container-tools: $(podman --version), $(buildah --version | cut -d' ' -f1-3)" >&2
