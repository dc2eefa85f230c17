#!/bin/sh
# Make `prometheus` and `promtool` available for the test suite (rule tests, dashboard queries).
#
# They come from Debian's `prometheus` package. When both are already on PATH this does nothing.
# Otherwise it installs the package non-interactively without recommends, and without letting the
# package start its system service: the tests run their own Prometheus on a free loopback port, and
# a service left running would hold port 9090 and keep scraping.
set -eu

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi

fail() {
    echo "ensure-prometheus: $*" >&2
    echo "ensure-prometheus: install Debian's 'prometheus' package (it provides prometheus and promtool)," >&2
    echo "ensure-prometheus: or put both binaries on PATH, then run the tests again." >&2
    exit 1
}

command -v apt-get >/dev/null 2>&1 || fail "prometheus/promtool are missing and apt-get is not available"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || fail "prometheus/promtool are missing and installing them needs root (no sudo)"
    SUDO="sudo -n"
fi

# policy-rc.d exiting 101 tells invoke-rc.d and deb-systemd-invoke not to start services.
POLICY=/usr/sbin/policy-rc.d
OWN_POLICY=""
if [ ! -e "$POLICY" ]; then
    OWN_POLICY=$POLICY
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
fi
cleanup() {
    if [ -n "$OWN_POLICY" ]; then
        $SUDO rm -f "$OWN_POLICY"
    fi
}
trap cleanup EXIT

echo "ensure-prometheus: installing Debian's prometheus package (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null ||
    fail "apt-get update failed"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold prometheus >/dev/null ||
    fail "apt-get install prometheus failed"

# Belt and braces, for hosts where the service manager ignored policy-rc.d: stop the package's
# service (only that unit, by its name) so nothing is left running.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    if systemctl is-active --quiet prometheus.service; then
        $SUDO systemctl stop prometheus.service
    fi
elif [ -x /etc/init.d/prometheus ]; then
    if /etc/init.d/prometheus status >/dev/null 2>&1; then
        $SUDO /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    fi
fi

command -v prometheus >/dev/null 2>&1 || fail "the package installed but 'prometheus' is not on PATH"
command -v promtool >/dev/null 2>&1 || fail "the package installed but 'promtool' is not on PATH"
echo "ensure-prometheus: $(prometheus --version 2>&1 | head -n 1)" >&2
