"""Find or install ``restate-server``: the npm build of the Restate server, cached per version.

The binary comes from the npm package ``@restatedev/restate-server`` (its per-platform optional
dependency carries a static binary), installed once into
``${TETHER_CACHE:-~/.cache/tether}/restate/<version>/``. Only the standard library is used.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import TetherError

#: The pinned server version. Keep in sync with ``scripts/install-restate.sh``. restate-sdk 1.2
#: supports servers 1.3 to 1.7 (service protocol v5..v7).
DEFAULT_RESTATE_VERSION = "1.7.12"

#: Environment variable naming a ``restate-server`` binary to use instead of the npm install.
BINARY_ENV = "TETHER_RESTATE_SERVER"
_NPM_PACKAGE = "@restatedev/restate-server"


class RestateInstallError(TetherError, RuntimeError):
    """No usable ``restate-server``: none given, and npm could not install one."""


def restate_cache_dir() -> Path:
    """``${TETHER_CACHE:-$HOME/.cache/tether}/restate``."""
    root = os.environ.get("TETHER_CACHE") or str(Path.home() / ".cache" / "tether")
    return Path(root).expanduser() / "restate"


def _platform_package() -> str:
    system = platform.system().lower()
    machine = platform.machine().lower()
    os_name = {"linux": "linux", "darwin": "darwin"}.get(system)
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    if os_name is None or arch is None:
        raise RestateInstallError(
            f"the npm package {_NPM_PACKAGE} has no binary for {system}/{machine}; "
            f"install restate-server yourself and set {BINARY_ENV} to its path"
        )
    return f"{_NPM_PACKAGE}-{os_name}-{arch}"


def _binary_in(prefix: Path) -> Path:
    return prefix / "node_modules" / _platform_package() / "bin" / "restate-server"


def _usable(binary: Path) -> bool:
    return binary.is_file() and os.access(binary, os.X_OK)


def _npm_install(npm: str, prefix: Path, spec: str) -> None:
    env = dict(os.environ)
    # The wrapper depends on @scarf/scarf, an install-analytics package. --ignore-scripts already
    # keeps its script from running; these make sure nothing else reports either.
    env.update({"SCARF_ANALYTICS": "false", "DO_NOT_TRACK": "1"})
    cmd = [
        npm,
        "install",
        "--ignore-scripts",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        "--prefix",
        str(prefix),
        spec,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RestateInstallError(
            f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )


def find_or_install_restate_server(
    version: str = DEFAULT_RESTATE_VERSION,
    *,
    cache_dir: Path | None = None,
    npm: str | None = None,
) -> Path:
    """Return the path of a ``restate-server`` binary of ``version``, installing it if needed.

    Order: ``$TETHER_RESTATE_SERVER`` if set; else the cached install under
    ``<cache_dir>/<version>/`` (``cache_dir`` defaults to :func:`restate_cache_dir`); else
    ``npm install --ignore-scripts`` of ``@restatedev/restate-server@<version>`` into that
    directory. The install goes to a temporary sibling directory that is renamed into place, under
    a file lock, so concurrent callers neither race nor see a half-installed tree.
    """
    override = os.environ.get(BINARY_ENV)
    if override:
        path = Path(override).expanduser()
        if not _usable(path):
            raise RestateInstallError(f"{BINARY_ENV}={override} is not an executable file")
        return path

    root = cache_dir if cache_dir is not None else restate_cache_dir()
    target = root / version
    binary = _binary_in(target)
    if _usable(binary):
        return binary

    npm_cmd = npm or shutil.which("npm")
    if npm_cmd is None:
        raise RestateInstallError(
            "npm was not found on PATH: install Node.js (with npm) to fetch restate-server, "
            f"or set {BINARY_ENV} to an existing restate-server binary"
        )

    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _usable(binary):  # installed by a concurrent caller while we waited for the lock
            return binary
        staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=root))
        staging.chmod(0o755)
        try:
            _npm_install(npm_cmd, staging, f"{_NPM_PACKAGE}@{version}")
            staged = _binary_in(staging)
            if not staged.is_file():
                # npm skips optional dependencies when configured to omit them; the platform
                # package carries the binary, so ask for it by name.
                _npm_install(npm_cmd, staging, f"{_platform_package()}@{version}")
            if not staged.is_file():
                raise RestateInstallError(
                    f"npm installed {_NPM_PACKAGE}@{version} but {staged} is missing"
                )
            staged.chmod(staged.stat().st_mode | 0o111)
            out = subprocess.run(
                [str(staged), "--version"], capture_output=True, text=True, check=False
            )
            if out.returncode != 0 or version not in out.stdout:
                raise RestateInstallError(
                    f"{staged} --version printed {out.stdout.strip()!r} (exit {out.returncode}), "
                    f"expected version {version}"
                )
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    if not _usable(binary):
        raise RestateInstallError(f"restate-server was installed but {binary} is not executable")
    return binary
