#!/bin/sh
# Make `ip` (iproute2) and `nft` (nftables) available for the network-fault tests
# (tests/integration/test_network_faults.py): they create a network namespace of their own, run the
# broker, the bridge and the receivers on its loopback, and cut or thin the traffic there with
# nftables rules. Also `openssl`, the command: the TLS tests run `openssl s_server` as a receiver
# that Python's ssl module cannot play (one that only offers finite-field key-exchange groups,
# tests/unit/test_tls.py). They come from Debian's packages. When both are already on PATH this does
# nothing; otherwise it installs what is missing, quietly. Creating namespaces and loading rules
# needs root (CAP_NET_ADMIN) as well: without it the tests fail and say so.
set -eu
# Root's tools live in sbin, which a non-root PATH may lack.
PATH="$PATH:/usr/sbin:/sbin"

missing=""
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
command -v nft >/dev/null 2>&1 || missing="$missing nftables"
command -v openssl >/dev/null 2>&1 || missing="$missing openssl"
[ -z "$missing" ] && exit 0

# nftables' package ships a service unit with an empty ruleset; nothing here enables or starts it,
# and the tests only ever load rules inside their own namespaces.
# shellcheck disable=SC2086 # the package names are meant to split
sh "$(dirname "$0")/../apt-install.sh" ensure-net-tools $missing

fail() {
    echo "ensure-net-tools: $*" >&2
    exit 1
}

command -v ip >/dev/null 2>&1 || fail "the packages installed but 'ip' is not on PATH"
command -v nft >/dev/null 2>&1 || fail "the packages installed but 'nft' is not on PATH"
command -v openssl >/dev/null 2>&1 || fail "the packages installed but 'openssl' is not on PATH"
echo "ensure-net-tools: $(nft --version)" >&2
