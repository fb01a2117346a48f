#!/usr/bin/env bash
# Build Prometheus's promtool for the alert tests (tests/helm/test_alerts.py: `promtool check
# rules` and `promtool test rules` on the chart's alerting rules) from the Go module proxy, at the
# Prometheus release the e2e's Prometheus runs (scripts/build-node.sh). Nothing lands in the
# repository.
#
# Layout (TETHER_CACHE defaults to ~/.cache/tether):
#   $TETHER_CACHE/prometheus/<version>/bin/promtool   the binary            <- printed on stdout
#   $TETHER_CACHE/go/{mod,build}                      the shared module and build caches
#
# Usage:
#   scripts/build-promtool.sh               build it if missing; print the binary's path on stdout
#   scripts/build-promtool.sh --print-path  print the path, build nothing
# Progress goes to stderr. With the binary present it only checks the file and returns at once.
set -euo pipefail

# ---- pinned versions ---------------------------------------------------------------------------
PROMETHEUS_VERSION=v0.316.0   # github.com/prometheus/prometheus, as in scripts/build-node.sh
GO_MIN=1.26.7                 # the module's `go` line
GO_PARALLEL=${TETHER_GO_PARALLEL:-2}
# -------------------------------------------------------------------------------------------------

CACHE_ROOT=$(realpath -m "${TETHER_CACHE:-$HOME/.cache/tether}")
PROMTOOL=$CACHE_ROOT/prometheus/$PROMETHEUS_VERSION/bin/promtool

log() { printf '[build-promtool %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
all_present() { [[ -x $PROMTOOL ]]; }

case ${1:-} in
  --print-path) echo "$PROMTOOL"; exit 0 ;;
  "") ;;
  -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument '$1' (use --print-path or no argument)" ;;
esac

if all_present; then
  log "cached: $PROMTOOL"
  echo "$PROMTOOL"
  exit 0
fi

BIN_DIR=$PROMTOOL   # what go-build.sh prints when another builder finished first: the binary
# shellcheck source=scripts/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build.sh"
prepare_go_build build-promtool "promtool $PROMETHEUS_VERSION"

started=$SECONDS
scratch=$(mktemp -d "$CACHE_ROOT/promtool.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
log "building promtool $PROMETHEUS_VERSION (minutes once; the build cache shares Prometheus's)"
(cd "$scratch" && GOBIN=$scratch go install -p "$GO_PARALLEL" -ldflags "-s -w" -tags netgo \
  "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION")
install_bins "$scratch" "$(dirname "$PROMTOOL")" promtool
log "built in $((SECONDS - started)) s: $PROMTOOL"
echo "$PROMTOOL"
