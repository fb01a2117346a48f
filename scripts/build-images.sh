#!/usr/bin/env bash
# Build every image the real-node e2e runs, with the local Docker engine and no registry (these
# machines reach none). Nothing lands in the repository; slow inputs are cached in $TETHER_CACHE
# (default ~/.cache/tether), and a warm run takes seconds.
#
#   tether-e2e/debian:bookworm      Debian bookworm (minbase + python3), from debootstrap; the root
#                                   filesystem's tarball is cached in $TETHER_CACHE/images/
#   tether-e2e/python:3.11-slim     a stand-in for the official python:3.11-slim: the same paths
#                                   (/usr/local/bin/python, pip, site-packages); it trusts this
#                                   host's CA bundle, because outbound TLS here is re-signed by a
#                                   local CA. Test infrastructure only: never a base users get.
#   $TETHER_IMAGE (tether:e2e)      the project's Dockerfile, unchanged, FROM the stand-in
#   tether-e2e/restate:<v>          the restate-server binary from npm, on the Debian base
#   tether-e2e/mcp-server-time:<v>  the example MCP server (mcp-server-time behind mcp-proxy)
#   tether-e2e/tether-mcp-stdio:<v> $TETHER_IMAGE with that server in /opt/server (stdio)
#   tether-e2e/pause:<v>, tether-e2e/coredns:<v>, tether-e2e/prometheus:<v>
#                                   one static binary each (scripts/build-node.sh), FROM scratch
#
# Usage: scripts/build-images.sh    builds what is missing or stale; prints `name=image` lines
# Progress goes to stderr.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE_ROOT=$(realpath -m "${TETHER_CACHE:-$HOME/.cache/tether}")
IMAGES=$CACHE_ROOT/images
SUITE=bookworm
MIRROR=${TETHER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE=tether-e2e/debian:$SUITE
STANDIN=tether-e2e/python:3.11-slim
TETHER_IMAGE=${TETHER_IMAGE:-tether:e2e}
SOURCE_LABEL=dev.tether.source   # the sha256 of what an image was built from

log() { printf '[build-images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v docker >/dev/null || die "docker is not on PATH"
docker info >/dev/null 2>&1 || die "no Docker engine answers (start dockerd)"

# A command's output only when it fails (docker's legacy builder warns at every build).
quietly() {
  local out
  if ! out=$("$@" 2>&1); then
    printf '%s\n' "$out" >&2
    die "$1 $2 failed"
  fi
}

# Build <tag> with the command, then remove the image it replaced (the build stages' layers
# stay: they are the cache of the next build).
replacing() {
  local tag=$1 old
  shift
  old=$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
  quietly "$@"
  if [[ -n $old && $old != $(docker image inspect -f '{{.Id}}' "$tag") ]]; then
    docker rmi "$old" >/dev/null 2>&1 || true
  fi
}

label_of() { docker image inspect -f "{{ index .Config.Labels \"$SOURCE_LABEL\" }}" "$1" 2>/dev/null || true; }

# The root filesystem, once per machine: about a minute from Debian's mirror.
base_image() {
  local tarball=$IMAGES/debian-$SUITE-python3.tar digest
  if [[ ! -s $tarball ]]; then
    command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install debootstrap)"
    mkdir -p "$IMAGES"
    local rootfs
    rootfs=$(mktemp -d "$IMAGES/rootfs.XXXXXX")
    log "debootstrap $SUITE (minbase + python3) from $MIRROR"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      "$SUITE" "$rootfs" "$MIRROR" >"$IMAGES/debootstrap.log" 2>&1 ||
      die "debootstrap failed; see $IMAGES/debootstrap.log"
    # What no container needs: package lists, caches, docs, manuals, translations.
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/log/* \
      "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
      "$rootfs"/usr/share/locale/*
    tar --numeric-owner -C "$rootfs" -cf "$tarball.part" .
    rm -rf "$rootfs"
    mv "$tarball.part" "$tarball"
  fi
  digest=$(sha256sum "$tarball" | cut -c1-64)
  if [[ $(label_of "$BASE") != "$digest" ]]; then
    log "import $BASE"
    docker import --change "LABEL $SOURCE_LABEL=$digest" "$tarball" "$BASE" >/dev/null
  fi
}

# Builds use the host's network: the engine the e2e starts has no bridge and writes no iptables
# rule (nothing of Docker's is left on the host after it), and RUN steps still reach PyPI.
BUILD=(docker build -q --network host)

# docker build from stdin's Dockerfile, in a context holding the given files; skipped when the
# image already carries the same source label.
build() { # <tag> <label> <dockerfile> [files...]
  local tag=$1 label=$2 dockerfile=$3 context
  shift 3
  if [[ $(label_of "$tag") == "$label" ]]; then
    log "cached: $tag"
    return
  fi
  context=$(mktemp -d)
  # shellcheck disable=SC2064  # expand now: the trap must remove this very directory
  trap "rm -rf '$context'" RETURN
  if (($#)); then cp -L "$@" "$context/"; fi
  log "build $tag"
  replacing "$tag" "${BUILD[@]}" --label "$SOURCE_LABEL=$label" -t "$tag" -f - "$context" \
    <<<"$dockerfile"
}

standin_image() {
  local ca=/etc/ssl/certs/ca-certificates.crt
  [[ -s $ca ]] || die "$ca is missing: the stand-in trusts this host's CA bundle"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$IMAGES/pip.conf"
  build "$STANDIN" "$(cat "$ca" "$IMAGES/pip.conf" <(label_of "$BASE") | sha256sum | cut -c1-64)" "
FROM $BASE
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY pip.conf /etc/pip.conf
RUN python3 -m venv /usr/local && /usr/local/bin/pip --version
" "$ca" "$IMAGES/pip.conf"
}

# One static binary FROM scratch, run as a non-root user.
binary_image() { # <tag> <binary>
  local tag=$1 binary=$2 name
  name=$(basename "$binary")
  build "$tag" "$(sha256sum "$binary" | cut -c1-64)" "
FROM scratch
COPY $name /bin/$name
USER 65532:65532
ENTRYPOINT [\"/bin/$name\"]
" "$binary"
}

base_image
standin_image
log "build $TETHER_IMAGE from the Dockerfile"
replacing "$TETHER_IMAGE" "${BUILD[@]}" --build-arg PYTHON_IMAGE="$STANDIN" \
  -t "$TETHER_IMAGE" "$ROOT"

# Like Restate's own image: Debian with CA certificates (it will not start without a bundle).
restate=$(bash "$ROOT/scripts/install-restate.sh" | tail -1)
restate_version=$("$restate" --version | awk '{print $2}')
build "tether-e2e/restate:$restate_version" \
  "$( (sha256sum "$restate"; label_of "$BASE") | sha256sum | cut -c1-64)" "
FROM $BASE
COPY restate-server /usr/local/bin/restate-server
WORKDIR /
ENTRYPOINT [\"/usr/local/bin/restate-server\"]
" "$restate"

# The example MCP server of examples/kubernetes/mcp-clock.yaml: mcp-server-time behind
# mcp-proxy's streamable HTTP, each in a venv of its own (they need different majors of `mcp`),
# pinned with their whole dependency closure by scripts/install-mcp-servers.sh.
mcp_context=$(mktemp -d)
for package in mcp-server-time mcp-proxy; do
  bash "$ROOT/scripts/install-mcp-servers.sh" --pins "$package" >"$mcp_context/$package.txt"
done
mcp_time_version=$(bash "$ROOT/scripts/install-mcp-servers.sh" --pins mcp-server-time | head -1 | cut -d= -f3)
mcp_image=tether-e2e/mcp-server-time:$mcp_time_version
build "$mcp_image" "$(cat "$mcp_context"/*.txt <(label_of "$STANDIN") | sha256sum | cut -c1-64)" "
FROM $STANDIN
COPY mcp-server-time.txt mcp-proxy.txt /tmp/
RUN /usr/local/bin/python -m venv /opt/server \
 && /opt/server/bin/pip install --no-cache-dir -q -r /tmp/mcp-server-time.txt \
 && /usr/local/bin/python -m venv /opt/proxy \
 && /opt/proxy/bin/pip install --no-cache-dir -q -r /tmp/mcp-proxy.txt
USER 65532:65532
EXPOSE 8080
ENTRYPOINT [\"/opt/proxy/bin/mcp-proxy\", \"--host\", \"0.0.0.0\", \"--port\", \"8080\", \"--\", \"/opt/server/bin/mcp-server-time\", \"--local-timezone\", \"UTC\"]
" "$mcp_context/mcp-server-time.txt" "$mcp_context/mcp-proxy.txt"
rm -rf "$mcp_context"

# The worker of examples/kubernetes/mcp-stdio.yaml: Tether's image with the same server in
# /opt/server, which the worker starts itself (stdio), confined by its sandbox.
mcp_stdio_image=tether-e2e/tether-mcp-stdio:$mcp_time_version
build "$mcp_stdio_image" "$( (docker image inspect -f '{{.Id}}' "$TETHER_IMAGE"; label_of "$mcp_image") | sha256sum | cut -c1-64)" "
FROM $mcp_image AS server
FROM $TETHER_IMAGE
COPY --from=server /opt/server /opt/server
"

node_bin=$(bash "$ROOT/scripts/build-node.sh")
for name in pause coredns prometheus; do
  [[ -x $node_bin/$name ]] || die "$node_bin/$name is missing after scripts/build-node.sh"
done
version_of() { basename "$(dirname "$(dirname "$(readlink -f "$node_bin/$1")")")"; }
pause=tether-e2e/pause:$(version_of pause)
coredns=tether-e2e/coredns:$(version_of coredns)
prometheus=tether-e2e/prometheus:$(version_of prometheus)
binary_image "$pause" "$node_bin/pause"
binary_image "$coredns" "$node_bin/coredns"
binary_image "$prometheus" "$node_bin/prometheus"

cat <<EOF
base=$BASE
tether=$TETHER_IMAGE
restate=tether-e2e/restate:$restate_version
pause=$pause
coredns=$coredns
prometheus=$prometheus
mcp=$mcp_image
mcp_stdio=$mcp_stdio_image
EOF
