#!/usr/bin/env bash
# Build the helm CLI for the chart tests (tests/helm) from the Go module proxy into
# $TETHER_CACHE/helm/<version>/bin/helm (TETHER_CACHE defaults to ~/.cache/tether); nothing lands
# in the repository. Prints the binary's path on stdout; progress goes to stderr.
#   scripts/build-helm.sh               build it if missing
#   scripts/build-helm.sh --print-path  print the path, build nothing
set -euo pipefail

HELM_VERSION=v3.22.0   # helm.sh/helm/v3
K8S_MINOR=37           # of the k8s.io/client-go it builds with (v0.37): helm's default kube
                       # version for `helm template` and `helm lint`, set by its own Makefile
CACHE_ROOT=$(realpath -m "${TETHER_CACHE:-$HOME/.cache/tether}")
BIN=$CACHE_ROOT/helm/$HELM_VERSION-k8s1.$K8S_MINOR/bin
HELM=$BIN/helm

log() { printf '[build-helm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

case ${1:-} in
  --print-path) echo "$HELM"; exit 0 ;;
  "") ;;
  *) log "error: unknown argument '$1' (use --print-path or no argument)"; exit 1 ;;
esac

if [[ -x $HELM ]]; then
  log "cached: $HELM"
  echo "$HELM"
  exit 0
fi
command -v go >/dev/null || { log "error: 'go' is not on PATH (helm $HELM_VERSION is built from source)"; exit 1; }
mkdir -p "$BIN"
exec 9>"$CACHE_ROOT/.build-helm.lock"
flock 9
if [[ ! -x $HELM ]]; then
  # The same module and build caches as scripts/build-control-plane.sh.
  export GOMODCACHE=$CACHE_ROOT/go/mod GOCACHE=$CACHE_ROOT/go/build CGO_ENABLED=0
  export GOFLAGS="-trimpath -modcacherw -buildvcs=false"
  log "building helm $HELM_VERSION with $(go env GOVERSION) (a few minutes, once)"
  started=$SECONDS
  flags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    flags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$K8S_MINOR"
  done
  GOBIN=$BIN go install -p "${TETHER_GO_PARALLEL:-2}" -ldflags "$flags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  log "built in $((SECONDS - started)) s: $HELM"
fi
echo "$HELM"
