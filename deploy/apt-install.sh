#!/bin/sh
# Install Debian packages quietly, for the deploy/*/ensure-*.sh scripts:
#   sh deploy/apt-install.sh NAME PACKAGE...
# NAME prefixes every message. Root installs directly, anyone else through `sudo -n`; without
# apt-get, or without root and sudo, it says so and exits 1, as when apt-get fails. Only the
# packages named are installed (no recommends), and configuration files already present are kept.
set -eu

name=$1
shift

packages="$*"

fail() {
    echo "$name: $*" >&2
    echo "$name: install Debian's packages ($packages) as root, then run again." >&2
    exit 1
}

command -v apt-get >/dev/null 2>&1 || fail "apt-get is not available to install $packages"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || fail "installing $packages needs root (no sudo)"
    SUDO="sudo -n"
fi

echo "$name: installing $packages (apt-get)" >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null || fail "apt-get update failed"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" >/dev/null ||
    fail "apt-get install $packages failed"
