#!/usr/bin/env bash
# Build a Docker-free Kubernetes control plane for the test suite (tests/kube):
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  (k8s.io/kubernetes)
#   etcd                                                              (go.etcd.io/etcd/server/v3)
#   kwok                                                              (sigs.k8s.io/kwok, fake nodes)
# Everything is built from the Go module proxy; nothing lands in the repository.
#
# Layout (TETHER_CACHE defaults to ~/.cache/tether):
#   $TETHER_CACHE/k8s/<k8s>/bin/    kube-* and kubectl, plus symlinks to etcd, kwok and
#                                   kwok-stages.yaml                                 <- "the bin dir"
#   $TETHER_CACHE/etcd/<etcd>/bin/etcd
#   $TETHER_CACHE/kwok/<kwok>/bin/kwok, kwok-stages.yaml (kwokctl's default "fast" node/pod stages;
#                                   the kwok binary itself has no built-in stages)
#   $TETHER_CACHE/build/            generated wrapper modules (go.mod is written by this script)
#   $TETHER_CACHE/go/{mod,build}    GOMODCACHE and GOCACHE, so later builds on this machine stay warm
#
# Usage:
#   scripts/build-control-plane.sh                  build what is missing; print the bin dir on stdout
#   scripts/build-control-plane.sh --print-bin-dir  print the bin dir, build nothing
# Progress goes to stderr. A run with everything present only checks files and returns at once.
# TETHER_K8S_EXTRA_TOOLS="kubelet kube-proxy" also builds those k8s.io/kubernetes/cmd/* into the bin
# dir, with the same module setup (scripts/build-node.sh uses it); unset, nothing else changes.
set -euo pipefail

# ---- pinned versions ---------------------------------------------------------------------------
K8S_VERSION=v1.36.3    # k8s.io/kubernetes; its staging modules are pinned to v0.<minor>.<patch>
ETCD_VERSION=v3.6.16   # go.etcd.io/etcd/server/v3 (kube 1.36 uses the etcd 3.6 client)
KWOK_VERSION=v0.8.0    # sigs.k8s.io/kwok (needs go >= 1.26.0)
GO_MIN=1.26.0          # the `go` line of k8s.io/kubernetes@v1.36.3 and sigs.k8s.io/kwok@v0.8.0
GO_PARALLEL=${TETHER_GO_PARALLEL:-2}   # go build -p: 2 cores, serial-ish builds
# -------------------------------------------------------------------------------------------------

CACHE_ROOT=$(realpath -m "${TETHER_CACHE:-$HOME/.cache/tether}")
K8S_BIN=$CACHE_ROOT/k8s/$K8S_VERSION/bin
ETCD_BIN=$CACHE_ROOT/etcd/$ETCD_VERSION/bin
KWOK_BIN=$CACHE_ROOT/kwok/$KWOK_VERSION/bin
K8S_TOOLS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
read -r -a K8S_EXTRA_TOOLS <<<"${TETHER_K8S_EXTRA_TOOLS:-}"   # optional, e.g. "kubelet kube-proxy"
# The stages kwokctl loads by default (pkg/kwokctl/runtime/cluster.go), from the kwok module source.
KWOK_STAGES=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)

log() { printf '[build-control-plane %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

all_present() {
  local t
  for t in "${K8S_TOOLS[@]}" "${K8S_EXTRA_TOOLS[@]}"; do [[ -x $K8S_BIN/$t ]] || return 1; done
  [[ -x $ETCD_BIN/etcd && -x $KWOK_BIN/kwok && -s $KWOK_BIN/kwok-stages.yaml ]] || return 1
  [[ $(readlink "$K8S_BIN/etcd" 2>/dev/null) == "$ETCD_BIN/etcd" ]] || return 1
  [[ $(readlink "$K8S_BIN/kwok" 2>/dev/null) == "$KWOK_BIN/kwok" ]] || return 1
  [[ $(readlink "$K8S_BIN/kwok-stages.yaml" 2>/dev/null) == "$KWOK_BIN/kwok-stages.yaml" ]] || return 1
}

for t in "${K8S_EXTRA_TOOLS[@]}"; do
  [[ $t =~ ^[a-z0-9-]+$ && " ${K8S_TOOLS[*]} " != *" $t "* ]] ||
    die "TETHER_K8S_EXTRA_TOOLS: '$t' is not an extra k8s.io/kubernetes/cmd/ name"
done

case ${1:-} in
  --print-bin-dir) echo "$K8S_BIN"; exit 0 ;;
  "") ;;
  -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument '$1' (use --print-bin-dir or no argument)" ;;
esac

# Fast path: no Go, no lock, only file checks.
if all_present; then
  log "cached: $K8S_BIN (kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION)"
  echo "$K8S_BIN"
  exit 0
fi

BIN_DIR=$K8S_BIN
# shellcheck source=scripts/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build.sh"
prepare_go_build build-control-plane "kubernetes $K8S_VERSION and kwok $KWOK_VERSION"

build_k8s() {
  local t missing=0
  for t in "${K8S_TOOLS[@]}"; do [[ -x $K8S_BIN/$t ]] || missing=1; done
  # All of K8S_TOOLS when one is missing, as without extras; plus the missing extra tools.
  local -a tools=()
  ((missing == 0)) || tools=("${K8S_TOOLS[@]}")
  for t in "${K8S_EXTRA_TOOLS[@]}"; do [[ -x $K8S_BIN/$t ]] || tools+=("$t"); done
  if ((${#tools[@]} == 0)); then log "kubernetes $K8S_VERSION: cached"; return; fi

  local ver=${K8S_VERSION#v} major minor staging_version mod_file dir
  major=${ver%%.*}
  minor=${ver#*.}; minor=${minor%%.*}
  staging_version=v0.${ver#*.}
  dir=$CACHE_ROOT/build/k8s-$K8S_VERSION
  mkdir -p "$dir"

  log "kubernetes $K8S_VERSION: reading the staging module list from its go.mod"
  mod_file=$(cd "$dir" && GOFLAGS=-mod=mod go list -m -f '{{.GoMod}}' "k8s.io/kubernetes@$K8S_VERSION")
  # Every `k8s.io/X => ./staging/src/k8s.io/X` replace of k8s.io/kubernetes becomes
  # `k8s.io/X => k8s.io/X v0.<minor>.<patch>` here; otherwise they resolve to the unserved v0.0.0.
  local -a staging
  mapfile -t staging < <(sed -nE 's#^[[:space:]]*(k8s\.io/[^[:space:]]+)[[:space:]]+=>[[:space:]]+\./staging/.*#\1#p' "$mod_file" | sort -u)
  ((${#staging[@]} > 20)) || die "found only ${#staging[@]} staging modules in $mod_file"
  log "kubernetes $K8S_VERSION: ${#staging[@]} staging modules pinned to $staging_version"

  {
    echo "// Generated by scripts/build-control-plane.sh; do not edit."
    echo "module tether.local/k8sbins"
    echo
    echo "go $(go env GOVERSION | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/').0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for m in "${staging[@]}"; do echo "	$m => $m $staging_version"; done
    echo ")"
  } >"$dir/go.mod"
  rm -f "$dir/go.sum"

  local -a pkgs=()
  for t in "${tools[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$t"); done
  log "kubernetes $K8S_VERSION: resolving modules (downloads a few hundred MB on a cold cache)"
  (cd "$dir" && go get "${pkgs[@]/%/@$K8S_VERSION}")

  local ldflags="" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  local out=$dir/out
  rm -rf "$out" && mkdir -p "$out"
  log "kubernetes $K8S_VERSION: compiling ${tools[*]} (-p $GO_PARALLEL; about 4-7 min on 2 cores with a cold Go cache)"
  (cd "$dir" && go build -p "$GO_PARALLEL" -ldflags "-s -w$ldflags" -o "$out/" "${pkgs[@]}")
  install_bins "$out" "$K8S_BIN" "${tools[@]}"
  log "kubernetes $K8S_VERSION: $("$K8S_BIN/${tools[0]}" --version)"
}

build_etcd() {
  if [[ -x $ETCD_BIN/etcd ]]; then log "etcd $ETCD_VERSION: cached"; return; fi
  local dir=$CACHE_ROOT/build/etcd-$ETCD_VERSION
  mkdir -p "$dir"
  # `go install go.etcd.io/etcd/server/v3@...` fails (its go.mod has replace directives), so a
  # tiny main calls etcdmain.Main like upstream server/main.go does.
  cat >"$dir/go.mod" <<EOF
// Generated by scripts/build-control-plane.sh; do not edit.
module tether.local/etcdbin

go $(go env GOVERSION | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/').0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
  cat >"$dir/main.go" <<'EOF'
// Generated by scripts/build-control-plane.sh; do not edit.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  rm -f "$dir/go.sum"
  log "etcd $ETCD_VERSION: resolving modules"
  (cd "$dir" && go mod tidy)
  rm -rf "$dir/out" && mkdir -p "$dir/out"
  log "etcd $ETCD_VERSION: compiling"
  (cd "$dir" && go build -p "$GO_PARALLEL" -ldflags "-s -w" -o "$dir/out/etcd" .)
  install_bins "$dir/out" "$ETCD_BIN" etcd
  log "etcd $ETCD_VERSION: $("$ETCD_BIN/etcd" --version | head -1)"
}

build_kwok() {
  local dir=$CACHE_ROOT/build/kwok-$KWOK_VERSION
  if [[ -x $KWOK_BIN/kwok ]]; then
    log "kwok $KWOK_VERSION: cached"
  else
    rm -rf "$dir" && mkdir -p "$dir"
    log "kwok $KWOK_VERSION: go install sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
    (cd "$dir" && GOBIN=$dir go install -p "$GO_PARALLEL" \
      -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
      "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION")
    install_bins "$dir" "$KWOK_BIN" kwok
    log "kwok $KWOK_VERSION: built"
  fi
  if [[ ! -s $KWOK_BIN/kwok-stages.yaml ]]; then
    local src f
    src=$(cd "$CACHE_ROOT" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" |
      sed -nE 's/^[[:space:]]*"Dir": "(.*)",?$/\1/p')
    [[ -d $src/kustomize/stage ]] || die "kwok source not found in the module cache ($src)"
    mkdir -p "$dir"
    for f in "${KWOK_STAGES[@]}"; do
      printf -- '---\n# kwok %s kustomize/stage/%s\n' "$KWOK_VERSION" "$f"
      cat "$src/kustomize/stage/$f"
    done >"$dir/kwok-stages.yaml"
    mv -f "$dir/kwok-stages.yaml" "$KWOK_BIN/kwok-stages.yaml"
    log "kwok $KWOK_VERSION: wrote ${#KWOK_STAGES[@]} default stages to $KWOK_BIN/kwok-stages.yaml"
  fi
}

start=$SECONDS
build_etcd
build_kwok
build_k8s
ln -sfn "$ETCD_BIN/etcd" "$K8S_BIN/etcd"
ln -sfn "$KWOK_BIN/kwok" "$K8S_BIN/kwok"
ln -sfn "$KWOK_BIN/kwok-stages.yaml" "$K8S_BIN/kwok-stages.yaml"
all_present || die "binaries missing after the build in $K8S_BIN"
log "done in $((SECONDS - start))s: $K8S_BIN"
echo "$K8S_BIN"
