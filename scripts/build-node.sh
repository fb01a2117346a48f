#!/usr/bin/env bash
# Build what a REAL single-node Kubernetes cluster needs on top of the control plane of
# scripts/build-control-plane.sh (etcd, kube-apiserver, kube-controller-manager, kube-scheduler):
#   kubelet, kube-proxy      k8s.io/kubernetes, built by scripts/build-control-plane.sh itself
#                            (TETHER_K8S_EXTRA_TOOLS), so its staging-module go.mod is not duplicated
#   pause                    `gcc -Os -static` of build/pause/linux/pause.c of k8s.io/kubernetes
#   coredns                  github.com/coredns/coredns with only the plugins of kubeadm's Corefile
#   local-path-provisioner   github.com/rancher/local-path-provisioner: PVCs as hostPath directories
#   prometheus               github.com/prometheus/prometheus (no embedded web UI; the HTTP API works)
#   kube-router              github.com/cloudnativelabs/kube-router/v2, run firewall-only: NetworkPolicy
# Everything is built from the Go module proxy (pause from the module's C source); nothing lands in
# the repository. Host tools used at run time, not installed here: ipset and iptables (kube-router).
#
# Layout (TETHER_CACHE defaults to ~/.cache/tether):
#   $TETHER_CACHE/node/<k8s>/bin/   symlinks to all of the above                 <- "the node bin dir"
#   $TETHER_CACHE/k8s/<k8s>/bin/{kubelet,kube-proxy}      (next to the control plane)
#   $TETHER_CACHE/<component>/<version>/bin/<binary>      pause, coredns, local-path-provisioner,
#                                                         prometheus, kube-router
#   $TETHER_CACHE/build/            generated wrapper modules and scratch output dirs
#   $TETHER_CACHE/go/{mod,build}    GOMODCACHE and GOCACHE, shared with build-control-plane.sh
#
# Usage:
#   scripts/build-node.sh                  build what is missing; print the node bin dir on stdout
#   scripts/build-node.sh --print-bin-dir  print the node bin dir, build nothing
# Progress goes to stderr. A run with everything present only checks files and returns at once.
# Measured on 2 cores with an empty Go build cache (modules already downloaded): kubelet+kube-proxy
# 3.5 min alone, 30 s after build-control-plane.sh; coredns 81 s; local-path-provisioner 58 s;
# kube-router 76 s; prometheus 6 min; pause < 1 s. Module downloads add about a minute or two.
set -euo pipefail

# ---- pinned versions ---------------------------------------------------------------------------
K8S_VERSION=v1.36.3     # k8s.io/kubernetes: kubelet, kube-proxy and pause.c; the same pin as
                        # scripts/build-control-plane.sh (checked below)
PAUSE_VERSION=3.10.2    # TAG in build/pause/Makefile of k8s.io/kubernetes@$K8S_VERSION (checked)
COREDNS_VERSION=v1.15.0 # github.com/coredns/coredns (needs go >= 1.26.0)
LPP_VERSION=v0.0.30     # github.com/rancher/local-path-provisioner: the newest the Go proxy serves
PROMETHEUS_VERSION=v0.316.0 # github.com/prometheus/prometheus (tags Prometheus 3.16.0 as v0.316.0;
                        # needs go >= 1.26.7)
KUBE_ROUTER_VERSION=v2.1.0  # github.com/cloudnativelabs/kube-router/v2: the newest the proxy serves
GO_MIN=1.26.7           # the highest `go` line of the modules above (prometheus)
GO_PARALLEL=${TETHER_GO_PARALLEL:-2}   # go build -p: 2 cores, serial-ish builds
# The plugins of kubeadm's default Corefile (cmd/kubeadm/app/phases/addons/dns/manifests.go), plus
# log; directive names of coredns' plugin.cfg (`prometheus` is the package plugin/metrics).
COREDNS_PLUGINS=(errors health ready kubernetes prometheus forward cache loop reload loadbalance log)
# -------------------------------------------------------------------------------------------------

SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_ROOT=$(realpath -m "${TETHER_CACHE:-$HOME/.cache/tether}")
NODE_BIN=$CACHE_ROOT/node/$K8S_VERSION/bin
K8S_BIN=$CACHE_ROOT/k8s/$K8S_VERSION/bin
K8S_NODE_TOOLS=(kubelet kube-proxy)
# name -> the binary that the node bin dir links to
declare -A TARGET=(
  [kubelet]=$K8S_BIN/kubelet
  [kube-proxy]=$K8S_BIN/kube-proxy
  [pause]=$CACHE_ROOT/pause/$PAUSE_VERSION/bin/pause
  [coredns]=$CACHE_ROOT/coredns/$COREDNS_VERSION/bin/coredns
  [local-path-provisioner]=$CACHE_ROOT/local-path-provisioner/$LPP_VERSION/bin/local-path-provisioner
  [prometheus]=$CACHE_ROOT/prometheus/$PROMETHEUS_VERSION/bin/prometheus
  [kube-router]=$CACHE_ROOT/kube-router/$KUBE_ROUTER_VERSION/bin/kube-router
)
NAMES=(kubelet kube-proxy pause coredns local-path-provisioner prometheus kube-router)

log() { printf '[build-node %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

all_present() {
  local n
  for n in "${NAMES[@]}"; do
    [[ -x ${TARGET[$n]} ]] || return 1
    [[ $(readlink "$NODE_BIN/$n" 2>/dev/null) == "${TARGET[$n]}" ]] || return 1
  done
}

case ${1:-} in
  --print-bin-dir) echo "$NODE_BIN"; exit 0 ;;
  "") ;;
  -h | --help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument '$1' (use --print-bin-dir or no argument)" ;;
esac

# Fast path: no Go, no lock, only file checks.
if all_present; then
  log "cached: $NODE_BIN"
  echo "$NODE_BIN"
  exit 0
fi

BIN_DIR=$NODE_BIN
# shellcheck source=scripts/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build.sh"
prepare_go_build build-node "prometheus $PROMETHEUS_VERSION"

go_line() { go env GOVERSION | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/'; }

# The source directory of a module version, downloaded into the shared GOMODCACHE.
module_dir() { # <module@version>
  (cd "$CACHE_ROOT" && go mod download -json "$1" | sed -nE 's/^[[:space:]]*"Dir": "(.*)",?$/\1/p')
}

# Move a finished binary in from a scratch dir, so an interrupted build never leaves a
# half-written binary that the fast path would accept.
install_bin() { # <built-file> <target>
  mkdir -p "$(dirname "$2")"
  mv -f "$1" "$2"
}

# `go install <pkg>@<version>` into a scratch dir, then into place. For modules whose go.mod has
# no replace directives (checked in their source at the pinned versions).
go_install() { # <name> <pkg@version> <ldflags> [go flags...]
  local name=$1 pkg=$2 ldflags=$3 dir
  shift 3
  dir=$CACHE_ROOT/build/$name-${pkg##*@}
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$dir" && GOBIN=$dir go install -p "$GO_PARALLEL" -ldflags "-s -w $ldflags" "$@" "$pkg")
  install_bin "$dir/$(basename "${pkg%@*}")" "${TARGET[$name]}"
}

build_kubelet() {
  local t missing=0
  for t in "${K8S_NODE_TOOLS[@]}"; do [[ -x ${TARGET[$t]} ]] || missing=1; done
  if ((missing == 0)); then log "kubelet, kube-proxy $K8S_VERSION: cached"; return; fi
  local t0=$SECONDS
  local cp_bin
  cp_bin=$(bash "$SCRIPTS/build-control-plane.sh" --print-bin-dir)
  [[ $cp_bin == "$K8S_BIN" ]] ||
    die "scripts/build-control-plane.sh builds into $cp_bin, not $K8S_BIN: pin the same K8S_VERSION"
  log "kubelet, kube-proxy $K8S_VERSION: scripts/build-control-plane.sh with TETHER_K8S_EXTRA_TOOLS"
  TETHER_K8S_EXTRA_TOOLS="${K8S_NODE_TOOLS[*]}" bash "$SCRIPTS/build-control-plane.sh" >/dev/null
  for t in "${K8S_NODE_TOOLS[@]}"; do
    [[ -x ${TARGET[$t]} ]] || die "scripts/build-control-plane.sh did not build ${TARGET[$t]}"
  done
  log "kubelet, kube-proxy $K8S_VERSION: $("${TARGET[kubelet]}" --version) ($((SECONDS - t0)) s)"
}

build_pause() {
  if [[ -x ${TARGET[pause]} ]]; then log "pause $PAUSE_VERSION: cached"; return; fi
  local t0=$SECONDS
  command -v gcc >/dev/null || die "'gcc' is not on PATH (pause is C): apt-get install -y gcc libc6-dev"
  local src tag dir=$CACHE_ROOT/build/pause-$PAUSE_VERSION
  src=$(module_dir "k8s.io/kubernetes@$K8S_VERSION")/build/pause
  [[ -f $src/linux/pause.c ]] || die "pause.c not found in the module cache ($src)"
  tag=$(sed -nE 's/^TAG \?= *([^[:space:]]+).*/\1/p' "$src/Makefile")
  [[ $tag == "$PAUSE_VERSION" ]] || die "k8s.io/kubernetes@$K8S_VERSION has pause $tag, not $PAUSE_VERSION"
  rm -rf "$dir" && mkdir -p "$dir"
  # The CFLAGS of build/pause/Makefile; its VERSION is "v<TAG>-<git describe>".
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-$K8S_VERSION" -o "$dir/pause" "$src/linux/pause.c"
  strip "$dir/pause" 2>/dev/null || true
  install_bin "$dir/pause" "${TARGET[pause]}"
  log "pause $PAUSE_VERSION: $("${TARGET[pause]}" -v) ($((SECONDS - t0)) s)"
}

# CoreDNS: the full build (coredns.go imports core/plugin, every plugin) pulls every cloud SDK.
# A generated main.go imports only the wanted plugins (the way core/plugin/zplugin.go does) and
# sets dnsserver.Directives to them, in the order of the module's plugin.cfg (the order of
# core/dnsserver/zdirectives.go, which would otherwise list directives with no plugin behind them).
build_coredns() {
  if [[ -x ${TARGET[coredns]} ]]; then log "coredns $COREDNS_VERSION: cached"; return; fi
  local t0=$SECONDS
  local src dir=$CACHE_ROOT/build/coredns-$COREDNS_VERSION name pkg
  src=$(module_dir "github.com/coredns/coredns@$COREDNS_VERSION")
  [[ -f $src/plugin.cfg ]] || die "coredns source not found in the module cache ($src)"
  local -a directives=() imports=()
  while IFS=: read -r name pkg; do
    [[ " ${COREDNS_PLUGINS[*]} " == *" $name "* ]] || continue
    directives+=("$name")
    [[ $pkg == */* ]] || pkg=github.com/coredns/coredns/plugin/$pkg
    imports+=("$pkg")
  done < <(grep -E '^[a-z0-9_]+:' "$src/plugin.cfg")
  ((${#directives[@]} == ${#COREDNS_PLUGINS[@]})) ||
    die "coredns $COREDNS_VERSION: plugin.cfg has only ${directives[*]} of ${COREDNS_PLUGINS[*]}"
  rm -rf "$dir" && mkdir -p "$dir/out"
  cat >"$dir/go.mod" <<EOF
// Generated by scripts/build-node.sh; do not edit.
module tether.local/corednsbin

go $(go_line).0

require github.com/coredns/coredns $COREDNS_VERSION
EOF
  {
    echo "// Generated by scripts/build-node.sh; do not edit."
    echo "// CoreDNS $COREDNS_VERSION with only: ${directives[*]}."
    echo "package main"
    echo
    echo "import ("
    echo '	"log"'
    echo
    echo '	"github.com/coredns/coredns/core/dnsserver"'
    echo '	"github.com/coredns/coredns/coremain"'
    echo
    for pkg in "${imports[@]}"; do echo "	_ \"$pkg\""; done
    echo ")"
    echo
    echo "func main() {"
    printf '\tif err := dnsserver.SetDirectives([]string{'
    printf '"%s", ' "${directives[@]}"
    printf '}); err != nil {\n'
    echo "		log.Fatal(err)"
    echo "	}"
    echo "	coremain.Run()"
    echo "}"
  } >"$dir/main.go"
  gofmt -w "$dir/main.go"
  log "coredns $COREDNS_VERSION: resolving modules"
  (cd "$dir" && go mod tidy)
  log "coredns $COREDNS_VERSION: compiling ${directives[*]} (about 1.5 min cold)"
  (cd "$dir" && go build -p "$GO_PARALLEL" -o "$dir/out/coredns" \
    -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" .)
  "$dir/out/coredns" -plugins >"$dir/out/plugins.txt"
  for name in "${directives[@]}"; do
    grep -qxE "[[:space:]]*(dns\.)?$name" "$dir/out/plugins.txt" || die "coredns -plugins does not list $name"
  done
  install_bin "$dir/out/coredns" "${TARGET[coredns]}"
  log "coredns $COREDNS_VERSION: $("${TARGET[coredns]}" -version | head -1) ($((SECONDS - t0)) s)"
}

# ---- local-path-provisioner ---------------------------------------------------------------------
# Found in its source at v0.0.30 (main.go, provisioner.go, util.go, deploy/local-path-storage.yaml):
# - As a plain host process (no pod), leader election is off in the code:
#     local-path-provisioner --debug start --kubeconfig KUBECONFIG --namespace local-path-storage \
#       --config /path/config.json --helper-pod-file /path/helperPod.yaml \
#       [--provisioner-name rancher.io/local-path] [--service-account-name SA] [--configmap-name NAME]
#   (--kubeconfig falls back to $KUBECONFIG, in-cluster, then ~/.kube/config.)
# - --config: a value ending in ".json" is read as a file, any other value is parsed as the JSON
#   itself; re-read every 30 s. Without --config it reads key config.json of the ConfigMap
#   --configmap-name (default local-path-config) in --namespace (default local-path-storage).
#     {"nodePathMap":[{"node":"DEFAULT_PATH_FOR_NON_LISTED_NODES","paths":["/var/lib/tether-pv"]}]}
#   ("node" is a node name or that catch-all; paths absolute, not "/"; optional "cmdTimeoutSeconds"
#   (default 120), "setupCommand", "teardownCommand", "sharedFileSystemPath", "storageClassConfigs").
# - --helper-pod-file: a Pod YAML with at least one container; without the flag it reads key
#   helperPod.yaml of the same ConfigMap (reloaded every 30 s only if $CONFIG_MOUNT_PATH is set).
#   Upstream's template: metadata.name helper-pod; spec.priorityClassName system-node-critical;
#   a toleration for node.kubernetes.io/disk-pressure; one container `helper-pod`, image busybox,
#   imagePullPolicy IfNotPresent. The provisioner adds nodeName, serviceAccountName (the
#   --service-account-name, default local-path-provisioner-service-account, which must exist in
#   the namespace), restartPolicy Never, a hostPath volume (DirectoryOrCreate) of the volume's parent
#   dir mounted at the same path, env VOL_DIR, VOL_MODE, VOL_SIZE_BYTES, and command
#   `/bin/sh /script/setup` (create) or `/bin/sh /script/teardown` (delete) with args
#   -p DIR -s BYTES -m MODE -a create|delete.
# - Unless config.json sets setupCommand/teardownCommand, /script comes from keys `setup` and
#   `teardown` of the ConfigMap --configmap-name in the namespace, so that ConfigMap must exist even
#   when the flags point at files. Upstream: setup `mkdir -m 0777 -p "$VOL_DIR"`, teardown
#   `rm -rf "$VOL_DIR"` (both `#!/bin/sh` + `set -eu`).
# - The helper image (only the template's image counts: --helper-image is parsed but never used)
#   needs /bin/sh, mkdir, rm, chmod, and must already be in containerd here (no registry), under the
#   template's name: a Debian minbase image tagged docker.io/library/busybox:latest, or a template
#   naming a local image.
# - The helper pod runs as root (it writes the hostPath), waits up to cmdTimeoutSeconds for phase
#   Succeeded, reads its log (pods/log: the apiserver must reach the kubelet) and deletes it.
#   PVs are hostPath with node affinity kubernetes.io/hostname; the StorageClass upstream ships is
#   `local-path`, provisioner rancher.io/local-path, volumeBindingMode WaitForFirstConsumer.
# - RBAC when not admin: see deploy/local-path-storage.yaml (pods in the namespace; nodes, pvcs,
#   configmaps, pods, pods/log read; persistentvolumes write; events create).
build_lpp() {
  if [[ -x ${TARGET[local-path-provisioner]} ]]; then log "local-path-provisioner $LPP_VERSION: cached"; return; fi
  local t0=$SECONDS
  log "local-path-provisioner $LPP_VERSION: go install (about 1 min cold)"
  go_install local-path-provisioner "github.com/rancher/local-path-provisioner@$LPP_VERSION" \
    "-X main.VERSION=$LPP_VERSION"
  log "local-path-provisioner $LPP_VERSION: $("${TARGET[local-path-provisioner]}" --version) ($((SECONDS - t0)) s)"
}

build_prometheus() {
  if [[ -x ${TARGET[prometheus]} ]]; then log "prometheus $PROMETHEUS_VERSION: cached"; return; fi
  local t0=$SECONDS
  local ver=${PROMETHEUS_VERSION#v0.} ldflags pkg=github.com/prometheus/common/version
  ver=3.${ver:1:2}.${ver##*.}   # v0.316.0 -> 3.16.0
  ldflags="-X $pkg.Version=$ver -X $pkg.Revision=$PROMETHEUS_VERSION -X $pkg.Branch=HEAD"
  ldflags+=" -X $pkg.BuildUser=tether -X $pkg.BuildDate=19700101-00:00:00"
  log "prometheus $PROMETHEUS_VERSION ($ver): go install (about 6 min cold; no embedded web UI)"
  go_install prometheus "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" \
    "$ldflags" -tags netgo
  log "prometheus $PROMETHEUS_VERSION: $("${TARGET[prometheus]}" --version | head -1) ($((SECONDS - t0)) s)"
}

# ---- NetworkPolicy: kube-router, firewall only ----------------------------------------------------
# Why not sigs.k8s.io/kube-network-policies (v0.8.0): it only programs nftables (an inet table whose
# postrouting chain sends new pod connections to userspace with the nftables `queue` expression,
# pkg/networkpolicy/controller.go), with no iptables fallback; this kernel lacks CONFIG_NFT_QUEUE,
# so that rule fails. kube-router's policy controller uses iptables (-m set/comment/mark/conntrack/
# physdev/addrtype/multiport/limit, -j MARK/NFLOG/REJECT, via iptables-save/-restore; the nft backend
# works) and ipsets of types hash:ip and hash:net only (its service proxy, off here, would add
# hash:ip,port), all compiled into this kernel. It runs the `ipset` tool (Debian package ipset)
# and fails at start without it. Its go.mod has no replace directives, so `go install` works.
# Run as a host process (root), on a node whose pods sit on a bridge (bridge CNI, host-local IPAM,
# pod CIDR 10.244.0.0/24, node IP 10.244.0.1) with kube-proxy in iptables mode:
#   kube-router --kubeconfig KUBECONFIG --hostname-override NODE_NAME \
#     --run-firewall=true --run-router=false --run-service-proxy=false --run-loadbalancer=false \
#     --enable-ipv4=true --enable-ipv6=false \
#     --service-cluster-ip-range SERVICE_CIDR (default 10.96.0.0/12; must be the apiserver's) \
#     --service-node-port-range 30000-32767 --iptables-sync-period 1m \
#     --health-port 20244 (0 disables) --metrics-port 0 [--v 1]
# - The node is found by $NODE_NAME, then the hostname, then --hostname-override; the pods it
#   guards are those whose status.hostIP equals one of that Node's addresses (10.244.0.1 here).
# - Pod-to-pod traffic on the same bridge is filtered only with net.bridge.bridge-nf-call-iptables=1
#   (br_netfilter is built in here; the value was 1); it matches it with -m physdev
#   --physdev-is-bridged. It inserts jumps to KUBE-ROUTER-INPUT/FORWARD/OUTPUT at the top of those
#   chains (above Docker's and the CNI firewall plugin's), uses marks 0x10000 and 0x20000 (kube-proxy
#   uses 0x4000 and 0x8000), and NFLOG group 100 for dropped packets.
# - `kube-router --cleanup-config` removes its iptables chains and ipsets (run it at teardown).
build_kube_router() {
  if [[ -x ${TARGET[kube-router]} ]]; then log "kube-router $KUBE_ROUTER_VERSION: cached"; return; fi
  local t0=$SECONDS
  local pkg=github.com/cloudnativelabs/kube-router/v2/pkg/version
  log "kube-router $KUBE_ROUTER_VERSION: go install (about 1.5 min cold)"
  go_install kube-router "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION" \
    "-X $pkg.Version=$KUBE_ROUTER_VERSION -X $pkg.BuildDate=1970-01-01T00:00:00Z"
  log "kube-router $KUBE_ROUTER_VERSION: $("${TARGET[kube-router]}" --version 2>&1 | head -1) ($((SECONDS - t0)) s)"
  command -v ipset >/dev/null || log "note: kube-router needs the ipset tool at run time (apt-get install -y ipset)"
}

start=$SECONDS
build_pause
build_kubelet
build_coredns
build_lpp
build_kube_router
build_prometheus
mkdir -p "$NODE_BIN"
for n in "${NAMES[@]}"; do ln -sfn "${TARGET[$n]}" "$NODE_BIN/$n"; done
all_present || die "binaries missing after the build in $NODE_BIN"
log "done in $((SECONDS - start))s: $NODE_BIN"
echo "$NODE_BIN"
