#!/usr/bin/env bash
# Build an OpenTelemetry Collector for the trace tests (tests/test_traces.py,
# tests/restate/test_traces_restate.py): the OTLP receiver and contrib's file exporter, nothing
# else, built with the OpenTelemetry Collector Builder (go.opentelemetry.io/collector/cmd/builder)
# from the Go module proxy. Nothing lands in the repository.
#
# Layout (TETHER_CACHE defaults to ~/.cache/tether):
#   $TETHER_CACHE/otelcol/<version>/bin/otelcol-tether   the collector       <- printed on stdout
#   $TETHER_CACHE/otelcol/<version>/tools/builder        the builder
#   $TETHER_CACHE/otelcol/<version>/src/                 the builder's manifest and generated module
#   $TETHER_CACHE/go/{mod,build}                         the module and build caches of every Go build
#
# Usage:
#   scripts/build-otelcol.sh               build it if missing; print the binary's path on stdout
#   scripts/build-otelcol.sh --print-path  print the path, build nothing
# Progress goes to stderr. With the binary present it only checks the file and returns at once.
set -euo pipefail

# ---- pinned versions ---------------------------------------------------------------------------
OTELCOL_VERSION=v0.161.0   # the builder, the OTLP receiver and contrib's fileexporter, one release
GO_MIN=1.26.0              # the `go` line of go.opentelemetry.io/collector/cmd/builder@v0.161.0
GO_PARALLEL=${TETHER_GO_PARALLEL:-2}   # go build -p: 2 cores
# -------------------------------------------------------------------------------------------------

CACHE_ROOT=$(realpath -m "${TETHER_CACHE:-$HOME/.cache/tether}")
ROOT=$CACHE_ROOT/otelcol/$OTELCOL_VERSION
OTELCOL=$ROOT/bin/otelcol-tether

log() { printf '[build-otelcol %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
all_present() { [[ -x $OTELCOL ]]; }

case ${1:-} in
  --print-path) echo "$OTELCOL"; exit 0 ;;
  "") ;;
  -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument '$1' (use --print-path or no argument)" ;;
esac

# Fast path: no Go, no lock, one file check.
if all_present; then
  log "cached: $OTELCOL (collector $OTELCOL_VERSION)"
  echo "$OTELCOL"
  exit 0
fi

BIN_DIR=$OTELCOL   # what go-build.sh prints when another builder finished first: the binary
# shellcheck source=scripts/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build.sh"
prepare_go_build build-otelcol "the OpenTelemetry Collector $OTELCOL_VERSION"
export GOFLAGS="$GOFLAGS -p=$GO_PARALLEL"

started=$SECONDS
if [[ ! -x $ROOT/tools/builder ]]; then
  log "installing the collector builder $OTELCOL_VERSION"
  GOBIN=$ROOT/tools go install "go.opentelemetry.io/collector/cmd/builder@$OTELCOL_VERSION"
fi

# A fresh scratch directory per build: the builder generates a Go module there and compiles it.
scratch=$(mktemp -d "$ROOT/src.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cat >"$scratch/manifest.yaml" <<EOF
dist:
  name: otelcol-tether
  description: OpenTelemetry Collector for Tether's trace tests (OTLP in, JSON lines out)
  version: ${OTELCOL_VERSION#v}
  output_path: $scratch/build
receivers:
  - gomod: go.opentelemetry.io/collector/receiver/otlpreceiver $OTELCOL_VERSION
exporters:
  - gomod: github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter $OTELCOL_VERSION
EOF
log "building the collector $OTELCOL_VERSION (otlpreceiver, fileexporter); minutes, once"
"$ROOT/tools/builder" --config "$scratch/manifest.yaml" >&2
"$scratch/build/otelcol-tether" --version >&2
install_bins "$scratch/build" "$ROOT/bin" otelcol-tether
rm -rf "$ROOT/src"
mv "$scratch" "$ROOT/src"   # kept for reading: the manifest and the generated module
trap - EXIT
log "built in $((SECONDS - started)) s: $OTELCOL"
echo "$OTELCOL"
