#!/bin/sh
# Builds helm from source with the Go toolchain into .cache/go-bin/helm, once (a few minutes of
# compiling; later calls return at once). Used by `make helm-tools` and by the tests.
set -eu
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
# What helm's own Makefile links in (the default Kubernetes version of `helm template` and lint is
# the k8s.io/client-go minor helm is built with: 1.37 for v3.22.0). Without them a `go install`ed
# helm assumes Kubernetes 1.20 and refuses the chart (kubeVersion >=1.29).
KUBE_MINOR="${HELM_KUBE_MINOR:-37}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="$root/.cache/go-bin"
stamp="$bin/helm.version"
want="$HELM_VERSION k8s-1.$KUBE_MINOR"
if [ -x "$bin/helm" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    exit 0
fi
GO="$(command -v go || echo /usr/local/go/bin/go)"
if [ ! -x "$GO" ]; then
    echo "helm $HELM_VERSION is built from source: install Go (golang) first" >&2
    exit 1
fi
echo "building helm $HELM_VERSION with $("$GO" env GOVERSION) (once, a few minutes)" >&2
mkdir -p "$bin"
pkg=helm.sh/helm/v3
ldflags="-s -w -X $pkg/internal/version.version=$HELM_VERSION"
for var in pkg/chartutil pkg/lint/rules; do
    ldflags="$ldflags -X $pkg/$var.k8sVersionMajor=1 -X $pkg/$var.k8sVersionMinor=$KUBE_MINOR"
done
GOBIN="$bin" "$GO" install -ldflags "$ldflags" "$pkg/cmd/helm@$HELM_VERSION"
echo "$want" > "$stamp"
