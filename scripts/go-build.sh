# Shared by the scripts that build Go binaries into $TETHER_CACHE (sourced, not run):
#   build-control-plane.sh, build-node.sh.
# The caller defines log, die, all_present (its fast-path check), BIN_DIR (what it prints),
# CACHE_ROOT, GO_MIN, GO_PARALLEL, and then calls `prepare_go_build <lock name> <needs Go for>`.
# shellcheck shell=bash

# Past the fast path: Go new enough, one builder at a time, and the shared module and build
# caches. Exits 0 (printing BIN_DIR) when another builder finished the work meanwhile.
prepare_go_build() { # <lock name> <what needs the Go version>
  local lock=$CACHE_ROOT/.$1.lock go_version
  command -v go >/dev/null || die "'go' is not on PATH; install Go >= $GO_MIN (the pinned modules need it)"
  go_version=$(go env GOVERSION)
  if [[ $(printf '%s\n' "go$GO_MIN" "$go_version" | sort -V | head -1) != "go$GO_MIN" ]]; then
    die "$go_version is too old: $2 need Go >= $GO_MIN"
  fi
  mkdir -p "$CACHE_ROOT"

  # One builder at a time (parallel pytest sessions or CI jobs on the same cache).
  if command -v flock >/dev/null; then
    exec 9>"$lock"
    if ! flock -n 9; then
      log "another build holds $lock; waiting"
      flock 9
    fi
  fi
  if all_present; then
    log "built by the other process: $BIN_DIR"
    echo "$BIN_DIR"
    exit 0
  fi

  export GOMODCACHE=$CACHE_ROOT/go/mod
  export GOCACHE=$CACHE_ROOT/go/build
  export GOFLAGS="-trimpath -modcacherw -buildvcs=false"
  export CGO_ENABLED=0
  export GOTOOLCHAIN=local   # fail clearly instead of downloading another toolchain
  export GOWORK=off
  unset GOBIN GOOS GOARCH
  log "$(go version); GOCACHE=$GOCACHE GOMODCACHE=$GOMODCACHE -p $GO_PARALLEL"
}

# Build into a scratch dir next to the target, then move finished binaries in, so an interrupted
# build never leaves a half-written binary that the fast path would accept.
install_bins() { # <from-dir> <to-dir> <names...>
  local from=$1 to=$2 name
  shift 2
  mkdir -p "$to"
  for name in "$@"; do mv -f "$from/$name" "$to/$name"; done
}
