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

# podman recommends crun and others; only what is named is installed (runc is the runtime used).
# shellcheck disable=SC2086 # the package names are meant to split
sh "$(dirname "$0")/../apt-install.sh" ensure-container-tools $PACKAGES || {
    echo "ensure-container-tools: or run a Docker engine, then run again." >&2
    exit 1
}

fail() {
    echo "ensure-container-tools: $*" >&2
    exit 1
}

for tool in $TOOLS; do
    command -v "$tool" >/dev/null 2>&1 || fail "the packages installed but '$tool' is not on PATH"
done
echo "ensure-container-tools: $(podman --version), $(buildah --version | cut -d' ' -f1-3)" >&2
