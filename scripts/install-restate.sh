#!/usr/bin/env bash
# Install the restate-server binary from the npm package @restatedev/restate-server into a cache
# directory outside the repository, and print the binary's path as the last line of stdout.
#
#   scripts/install-restate.sh [VERSION]
#
# Cache: ${TETHER_CACHE:-$HOME/.cache/tether}/restate/<version>/. A second run finds the binary
# there and returns at once. The Python twin is tether.programs.restate_server.find_or_install_restate_server
# (same layout, same pin): keep RESTATE_VERSION equal to DEFAULT_RESTATE_VERSION there.
#
# The wrapper package depends on @scarf/scarf, an install-analytics script: npm runs with
# --ignore-scripts. The binary itself lives in the per-platform optional dependency
# (@restatedev/restate-server-linux-x64, ...); if npm skipped it, it is installed by name.
set -euo pipefail

RESTATE_VERSION="1.7.12"
version="${1:-$RESTATE_VERSION}"
package="@restatedev/restate-server"

case "$(uname -s)" in
  Linux) os=linux ;;
  Darwin) os=darwin ;;
  *) echo "install-restate: no restate-server npm binary for $(uname -s)" >&2; exit 1 ;;
esac
case "$(uname -m)" in
  x86_64 | amd64) arch=x64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "install-restate: no restate-server npm binary for $(uname -m)" >&2; exit 1 ;;
esac
platform_package="${package}-${os}-${arch}"

root="${TETHER_CACHE:-$HOME/.cache/tether}/restate"
target="$root/$version"
rel_binary="node_modules/${platform_package}/bin/restate-server"

if [[ -x "$target/$rel_binary" ]]; then
  echo "$target/$rel_binary"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "install-restate: npm not found; install Node.js (with npm) first" >&2
  exit 1
fi

mkdir -p "$root"
exec 9>"$root/.${version}.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
fi
if [[ -x "$target/$rel_binary" ]]; then  # a concurrent run finished while we waited
  echo "$target/$rel_binary"
  exit 0
fi

staging="$(mktemp -d "$root/.${version}-XXXXXX")"
chmod 755 "$staging"
trap 'rm -rf "$staging"' EXIT

npm_install() {
  SCARF_ANALYTICS=false DO_NOT_TRACK=1 npm install --ignore-scripts --no-audit --no-fund \
    --loglevel=error --prefix "$staging" "$1" >&2
}

npm_install "${package}@${version}"
if [[ ! -f "$staging/$rel_binary" ]]; then
  npm_install "${platform_package}@${version}"
fi
if [[ ! -f "$staging/$rel_binary" ]]; then
  echo "install-restate: $staging/$rel_binary is missing after npm install" >&2
  exit 1
fi
chmod +x "$staging/$rel_binary"
if ! "$staging/$rel_binary" --version | grep -qF "$version"; then
  echo "install-restate: $rel_binary --version does not report $version" >&2
  exit 1
fi

rm -rf "$target"
mv "$staging" "$target"
trap - EXIT
echo "$target/$rel_binary"
