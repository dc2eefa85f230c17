#!/bin/sh
# Build the bridge image from deploy/docker/Dockerfile (run from the repository root; `make image`).
#
#   sh deploy/docker/build-image.sh [TAG]        (default TAG: transaction-webhook-bridge:<version>)
#
# Where a Docker engine answers (`docker info`), or CONTAINER_ENGINE=docker, this is plain
# `docker build` on the Dockerfile's default base (the official Python slim image).
#
# Otherwise it builds daemonless with buildah (installed by ensure-container-tools.sh). With
# PYTHON_IMAGE unset and no image registry reachable, the base is made locally instead: Debian
# bookworm minbase with its python3 (3.11), bootstrapped by mmdebstrap from this host's apt sources
# and options, cached as .cache/container/base-<key>.tar.gz and imported as localhost/bridge-base:<key>.
# The key hashes the recipe and the host's apt sources, so the base is remade only when they
# change (delete the tar to refresh it with newer Debian packages). PYTHON_IMAGE=<image> builds on
# that image instead (e.g. python:3.11.11-slim-bookworm where a registry is reachable).
#
# The image is also tagged localhost/transaction-webhook-bridge:src-<hash of the build context>,
# and when that tag exists it is reused without building (FORCE=1 rebuilds). Prints the tag.
set -eu

cd "$(dirname "$0")/../.."
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' bridge/__init__.py)
TAG=${1:-transaction-webhook-bridge:$VERSION}
DOCKERFILE=${DOCKERFILE:-deploy/docker/Dockerfile}
CACHE=.cache/container
mkdir -p "$CACHE"

log() { echo "build-image: $*" >&2; }

# The build context: exactly what the Dockerfile copies (see .dockerignore).
context_hash() {
    find "$DOCKERFILE" pyproject.toml README.md bridge schemas -type f \
        ! -path '*/__pycache__/*' ! -name '*.pyc' | LC_ALL=C sort | xargs sha256sum |
        sha256sum | cut -c1-16
}

if [ "${CONTAINER_ENGINE:-}" = docker ] || { [ -z "${CONTAINER_ENGINE:-}" ] &&
    command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }; then
    log "docker build -t $TAG"
    docker build ${PYTHON_IMAGE:+--build-arg PYTHON_IMAGE=$PYTHON_IMAGE} \
        -f "$DOCKERFILE" -t "$TAG" . >&2
    echo "$TAG"
    exit 0
fi

sh deploy/docker/ensure-container-tools.sh

SOURCE_TAG=localhost/transaction-webhook-bridge:src-$(context_hash)
if [ -z "${FORCE:-}" ] && podman image exists "$SOURCE_TAG"; then
    podman tag "$SOURCE_TAG" "$TAG"
    log "up to date: $SOURCE_TAG"
    echo "$TAG"
    exit 0
fi

# --- the local stand-in for python:3.11-slim-bookworm -------------------------------------------
# Larger than python:slim by about 60 MB: minbase brings usrmerge and with it a full perl.
BASE_PACKAGES="usr-is-merged,python3,python3-pip,python3-venv,python-is-python3,ca-certificates"
APT_SOURCES=$(ls /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
# apt options that reach the mirror (proxies, snapshot dates), not the host's housekeeping hooks.
APT_OPTIONS=$(grep -lis -e proxy -e Check-Valid-Until -e Check-Date /etc/apt/apt.conf.d/* 2>/dev/null || true)
if [ -z "${PYTHON_IMAGE:-}" ]; then
    KEY=$( { echo "minbase bookworm $BASE_PACKAGES v1"; cat $APT_SOURCES $APT_OPTIONS /dev/null; } |
        sha256sum | cut -c1-12)
    PYTHON_IMAGE=localhost/bridge-base:bookworm-$KEY
    BASE_TAR=$CACHE/base-bookworm-$KEY.tar.gz
    if ! podman image exists "$PYTHON_IMAGE"; then
        if [ ! -s "$BASE_TAR" ]; then
            log "bootstrapping the local base (mmdebstrap, bookworm minbase): $BASE_TAR"
            set --
            for file in $APT_SOURCES; do set -- "$@" "$file"; done
            [ $# -gt 0 ] || set -- http://deb.debian.org/debian
            for file in $APT_OPTIONS; do set -- --aptopt="$file" "$@"; done
            mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" \
                --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
                --dpkgopt='path-exclude=/usr/share/locale/*' \
                --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
                bookworm "$BASE_TAR.tmp.tar.gz" "$@" >&2
            mv "$BASE_TAR.tmp.tar.gz" "$BASE_TAR"
        fi
        log "importing $BASE_TAR as $PYTHON_IMAGE"
        podman import --quiet --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
            "$BASE_TAR" "$PYTHON_IMAGE" >/dev/null
    fi
fi

# --- the build -----------------------------------------------------------------------------------
# pip in the build stage reaches PyPI over the host network with the host's CA bundle (read-only),
# and the host's pip settings (index, proxy, timeouts) passed as build environment.
CA=/etc/ssl/certs/ca-certificates.crt
log "buildah bud on $PYTHON_IMAGE -> $TAG"
start=$(date +%s)
# shellcheck disable=SC2046
buildah bud --quiet --isolation chroot --network host --pull=never --layers \
    --build-arg PYTHON_IMAGE="$PYTHON_IMAGE" \
    ${PIP_INDEX_URL:+--build-arg PIP_INDEX_URL=$PIP_INDEX_URL} \
    $( [ -s "$CA" ] && echo "--volume /etc/ssl/certs:/etc/ssl/certs:ro --build-arg PIP_CERT=$CA" ) \
    ${https_proxy:+--build-arg https_proxy=$https_proxy} ${HTTPS_PROXY:+--build-arg HTTPS_PROXY=$HTTPS_PROXY} \
    -f "$DOCKERFILE" -t "$TAG" -t "$SOURCE_TAG" . >&2
log "built $TAG in $(( $(date +%s) - start )) s ($(podman image inspect --format '{{.Size}}' "$TAG") bytes)"
echo "$TAG"
