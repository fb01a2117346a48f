#!/usr/bin/env bash
# Install real MCP servers that others publish on PyPI, each into a venv of its own in a cache
# directory outside the repository, for the MCP tests (tests/mcp). Prints one line per package on
# stdout, `<package> <version> <venv>`; everything pip says goes to stderr.
#
#   scripts/install-mcp-servers.sh [PACKAGE ...]     # default: all of them
#   scripts/install-mcp-servers.sh --pins PACKAGE    # its pinned requirements (for an image)
#
# Cache: ${TETHER_CACHE:-$HOME/.cache/tether}/mcp/<package>-<version>/, a venv whose bin/ holds the
# package's entry point. A venv counts as installed once its stamp file (.tether-pins) holds exactly
# the pins below, so a second run finds everything and returns at once; change a pin and the next
# run rebuilds that venv. The interpreter is $TETHER_MCP_PYTHON, else python3.11, else python3
# (3.10 or newer, which the servers require).
#
# Every package is pinned with its whole dependency closure (pip freeze of a fresh install), so a
# new release of a dependency (mcp itself above all) cannot change what the tests run against.
#
#   mcp-server-time   get_current_time, convert_time (offline)
#   mcp-server-git    git_* on a local repository (offline)
#   mcp-server-fetch  fetch; refuses loopback unless started with --allow-private-ips. Its
#                     readabilipy dependency runs `npm install` (unpinned, with install scripts)
#                     into its own package directory on the first fetch when node and npm are on
#                     PATH: done here instead, pinned and with --ignore-scripts, so no test
#                     downloads anything. Without npm here, readabilipy stays pure Python.
#   mcp-proxy         sparfenyuk's proxy: a stdio server behind SSE (/sse) and streamable HTTP
#                     (/mcp); built on mcp 1.x, so it speaks the handshake-era protocol.
set -euo pipefail

# The packages, in the order they are installed, with their versions.
PACKAGES=(mcp-server-time mcp-server-git mcp-server-fetch mcp-proxy)

version_of() {
  case "$1" in
    mcp-server-time) echo "2026.10.19" ;;
    mcp-server-git) echo "2026.10.19" ;;
    mcp-server-fetch) echo "2026.10.24" ;;
    mcp-proxy) echo "0.13.0" ;;
    *) return 1 ;;
  esac
}

# The requirements of one package's venv: the package itself, then its dependency closure.
pins_of() {
  local common_mcp2=(
    annotated-types==0.8.0 anyio==4.16.0 attrs==26.1.0 cffi==2.1.1 click==8.5.1
    cryptography==50.0.2 h11==0.16.0 httpcore2==2.16.2 httpx2==2.16.2 idna==3.20
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 mcp==2.3.0 mcp-types==2.3.0
    opentelemetry-api==1.45.2 pycparser==3.12 pydantic==2.14.4 pydantic_core==2.50.5
    PyJWT==2.15.1 python-multipart==0.0.34 referencing==0.37.0 rpds-py==2026.9.1
    sse-starlette==3.7.0 starlette==1.10.0 truststore==0.10.5 typing-inspection==0.4.5
    typing_extensions==4.16.0 uvicorn==0.54.0
  )
  case "$1" in
    mcp-server-time)
      printf '%s\n' "mcp-server-time==$(version_of "$1")" "${common_mcp2[@]}" \
        tzdata==2026.6 tzlocal==5.4.5
      ;;
    mcp-server-git)
      printf '%s\n' "mcp-server-git==$(version_of "$1")" "${common_mcp2[@]}" \
        gitdb==4.0.12 GitPython==3.2.1 smmap==5.0.3
      ;;
    mcp-server-fetch)
      printf '%s\n' "mcp-server-fetch==$(version_of "$1")" "${common_mcp2[@]}" \
        beautifulsoup4==4.15.0 certifi==2026.10.19.post1 charset-normalizer==3.5.3 html5lib==1.1 \
        httpcore==1.0.9 httpx==0.28.1 lxml==6.1.3 markdownify==1.2.3 Protego==0.7.0 \
        readabilipy==0.3.0 regex==2026.11.19 requests==2.34.2 six==1.17.0 socksio==1.0.0 \
        soupsieve==4.1.3 urllib3==2.8.0 webencodings==0.6.1
      ;;
    mcp-proxy)
      printf '%s\n' "mcp-proxy==$(version_of "$1")" \
        annotated-types==0.8.0 anyio==4.16.0 attrs==26.1.0 certifi==2026.10.19.post1 \
        cffi==2.1.1 click==8.5.1 cryptography==50.0.2 h11==0.16.0 httpcore==1.0.9 \
        httpx==0.28.1 httpx-sse==0.4.3 httpx_auth==0.23.1 idna==3.20 jsonschema==4.26.0 \
        jsonschema-specifications==2025.9.1 mcp==1.30.0 pycparser==3.12 pydantic==2.14.4 \
        pydantic-settings==2.16.3 pydantic_core==2.50.5 PyJWT==2.15.1 python-dotenv==1.2.4 \
        python-multipart==0.0.34 referencing==0.37.0 rpds-py==2026.9.1 sse-starlette==3.7.0 \
        starlette==1.10.0 typing-inspection==0.4.5 typing_extensions==4.16.0 uvicorn==0.54.0
      ;;
    *) return 1 ;;
  esac
}

# What readabilipy's package.json asks for (>= ranges there), pinned.
READABILIPY_NPM_PINS=(@mozilla/readability@0.6.0 jsdom@29.1.1 minimist@1.2.8)

if [[ ${1:-} == --pins ]]; then
  pins_of "${2:?--pins takes a package}"
  exit
fi

root="${TETHER_CACHE:-$HOME/.cache/tether}/mcp"

if (($# > 0)); then
  wanted=("$@")
else
  wanted=("${PACKAGES[@]}")
fi

python=""
pick_python() {
  [[ -n "$python" ]] && return 0
  local candidate
  for candidate in "${TETHER_MCP_PYTHON:-}" python3.11 python3; do
    [[ -n "$candidate" ]] || continue
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      python="$candidate"
      return 0
    fi
  done
  echo "install-mcp-servers: no Python 3.10+ found (set TETHER_MCP_PYTHON)" >&2
  return 1
}

# The venv's entry point answers --help: the package imports and starts on this interpreter.
check_starts() {
  local package="$1" venv="$2"
  if ! "$venv/bin/$package" --help >/dev/null 2>"$venv/.help-stderr"; then
    echo "install-mcp-servers: $venv/bin/$package --help failed:" >&2
    cat "$venv/.help-stderr" >&2
    return 1
  fi
  rm -f "$venv/.help-stderr"
}

install_one() {
  local package="$1" version="$2" venv="$3" pins="$4"
  local requirements
  mapfile -t requirements <<<"$pins"
  echo "install-mcp-servers: installing $package $version into $venv" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-input \
    "${requirements[@]}" >&2
  "$venv/bin/python" -m pip check >&2
  if [[ "$package" == mcp-server-fetch ]] && command -v npm >/dev/null 2>&1; then
    local jsdir
    jsdir="$("$venv/bin/python" -c \
      'import os, readabilipy; print(os.path.join(os.path.dirname(readabilipy.__file__), "javascript"))')"
    (cd "$jsdir" && npm install --ignore-scripts --no-audit --no-fund --loglevel=error \
      "${READABILIPY_NPM_PINS[@]}" >&2)
  fi
  check_starts "$package" "$venv"
  printf '%s\n' "$pins" >"$venv/.tether-pins"
}

in_progress=""
on_exit() {
  local status=$?
  if [[ -n "$in_progress" ]]; then
    rm -rf "$in_progress"
    echo "install-mcp-servers: installing into $in_progress failed (exit $status); removed it" >&2
  fi
}
trap on_exit EXIT

for package in "${wanted[@]}"; do
  if ! version="$(version_of "$package")"; then
    echo "install-mcp-servers: unknown package $package (known: ${PACKAGES[*]})" >&2
    exit 2
  fi
  pins="$(pins_of "$package")"
  venv="$root/$package-$version"
  stamp="$venv/.tether-pins"
  if [[ -f "$stamp" && "$(<"$stamp")" == "$pins" ]]; then
    echo "$package $version $venv"
    continue
  fi
  mkdir -p "$root"
  exec 9>"$root/.$package-$version.lock"
  if command -v flock >/dev/null 2>&1; then
    flock 9
  fi
  # A concurrent run may have finished it while we waited for the lock.
  if ! [[ -f "$stamp" && "$(<"$stamp")" == "$pins" ]]; then
    pick_python
    # Not called as a condition, so that `set -e` stays in force inside; a failure leaves no venv.
    in_progress="$venv"
    install_one "$package" "$version" "$venv" "$pins"
    in_progress=""
  fi
  exec 9>&-
  echo "$package $version $venv"
done
