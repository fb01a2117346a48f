"""Fixtures that run real MCP servers (tests/mcp/servers.py has the helpers).

Session-scoped, started once:
- `mcp_packages`: the pinned PyPI servers, installed by `scripts/install-mcp-servers.sh` into
  ~/.cache/tether/mcp (about a minute the first time, milliseconds after). If the script fails,
  every test that uses a real server fails with its stderr: nothing is skipped.
- `time_server_stdio`, `fetch_server_stdio`: `StdioServer` descriptions (`.argv`, `.env`,
  `.params()` for `mcp.Client`); each connection launches its own process.
- `time_server_http`: `mcp-server-time` behind `mcp-proxy`, a running `HttpServerProcess`;
  `.url` is its streamable-HTTP endpoint (http://127.0.0.1:<port>/mcp).
- `loopback_site`: a web page on 127.0.0.1 for `fetch`, recording the paths it was asked for.

Per test:
- `cache_home` (autouse): `XDG_CACHE_HOME`, where confined stdio servers get their homes.
- `git_repo` (a repository with one commit) and `git_server_stdio` confined to it.
- `start_mcp_proxy(stdio_server)`: any stdio server behind a fresh `mcp-proxy`.
- `suite_files` (calls log, release file, tool-list marker: `SuiteFiles`), and the suite server
  on them: `suite_server_http` (a running `HttpServerProcess`) and `suite_server_stdio`;
  `start_suite_server(files=None)` starts more.

Every process started here runs in a session of its own, is stopped with its process groups and
descendants at teardown, and its port is checked free; its log is printed when a test fails.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.mcp.servers import (
    HttpServerProcess,
    InstalledPackage,
    LoopbackSite,
    McpInstallError,
    StdioServer,
    SuiteFiles,
    fetch_server,
    git_server,
    install_mcp_servers,
    mcp_proxy,
    serve_loopback_site,
    suite_http_server,
    suite_stdio_server,
    time_server,
)
from tether.testing import dump_logs_if_failed


@pytest.fixture(scope="session")
def mcp_packages() -> dict[str, InstalledPackage]:
    """Every package of the install script: name -> its venv in the cache."""
    try:
        return install_mcp_servers()
    except McpInstallError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def time_server_stdio(mcp_packages: dict[str, InstalledPackage]) -> StdioServer:
    """`mcp-server-time --local-timezone UTC`."""
    return time_server(mcp_packages)


@pytest.fixture(scope="session")
def fetch_server_stdio(mcp_packages: dict[str, InstalledPackage]) -> StdioServer:
    """`mcp-server-fetch --allow-private-ips --ignore-robots-txt` (loopback allowed)."""
    return fetch_server(mcp_packages)


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    """A git repository with one commit (`README.md`) and one untracked file (`notes.txt`)."""
    git = shutil.which("git")
    assert git, "git is needed for the mcp-server-git tests"
    repo = tmp_path / "repo"
    repo.mkdir()
    env_args = ["-c", "user.name=Tether Tests", "-c", "user.email=tests@tether.invalid"]

    def run(*args: str) -> None:
        subprocess.run([git, *env_args, *args], cwd=repo, check=True, capture_output=True)

    run("init", "-q", "-b", "main")
    (repo / "README.md").write_text("# demo\n")
    run("add", "README.md")
    run("commit", "-q", "-m", "first commit")
    (repo / "notes.txt").write_text("untracked\n")
    return repo


@pytest.fixture
def git_server_stdio(mcp_packages: dict[str, InstalledPackage], git_repo: Path) -> StdioServer:
    """`mcp-server-git --repository <git_repo>`."""
    return git_server(mcp_packages, git_repo)


@pytest.fixture(scope="session")
def mcp_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-logs")


@pytest.fixture(scope="session")
def time_server_http(
    mcp_packages: dict[str, InstalledPackage], time_server_stdio: StdioServer, mcp_logs: Path
) -> Iterator[HttpServerProcess]:
    """`mcp-server-time` behind `mcp-proxy`, for the whole session (it keeps no state)."""
    proxy = mcp_proxy(mcp_packages, time_server_stdio, log=mcp_logs / "mcp-proxy-time.log")
    with proxy:
        yield proxy


@pytest.fixture
def start_mcp_proxy(
    mcp_packages: dict[str, InstalledPackage], tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., HttpServerProcess]]:
    """`start_mcp_proxy(stdio_server, stateless=False)`: a started proxy, stopped after the test."""
    started: list[HttpServerProcess] = []

    def start(server: StdioServer, *, stateless: bool = False) -> HttpServerProcess:
        log = tmp_path / f"mcp-proxy-{len(started)}.log"
        proxy = mcp_proxy(mcp_packages, server, log=log, stateless=stateless)
        started.append(proxy)
        return proxy.start()

    yield start
    dump_logs_if_failed(request, {p.name: p.log_tail for p in started})
    for proxy in started:
        proxy.stop()


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Confined stdio servers' homes (`tether.tools.mcp.server_home`) go under the test's
    directory, not the user's cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


@pytest.fixture
def suite_files(tmp_path: Path) -> SuiteFiles:
    """The files of this test's suite server (slow tools block until `.release()`)."""
    directory = tmp_path / "suite"
    directory.mkdir()
    return SuiteFiles(directory)


@pytest.fixture
def start_suite_server(
    suite_files: SuiteFiles, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., HttpServerProcess]]:
    """`start_suite_server(files=None)`: a started suite server over HTTP (on `suite_files` by
    default), stopped after the test."""
    started: list[HttpServerProcess] = []

    def start(files: SuiteFiles | None = None) -> HttpServerProcess:
        log = tmp_path / f"suite-server-{len(started)}.log"
        server = suite_http_server(files or suite_files, log=log)
        started.append(server)
        return server.start()

    yield start
    dump_logs_if_failed(request, {f"{s.name} on {s.port}": s.log_tail for s in started})
    for server in started:
        server.stop()


@pytest.fixture
def suite_server_http(start_suite_server: Callable[..., HttpServerProcess]) -> HttpServerProcess:
    """The suite server over streamable HTTP on `suite_files`; `.url` is its endpoint."""
    return start_suite_server()


@pytest.fixture
def suite_server_stdio(suite_files: SuiteFiles) -> StdioServer:
    """The suite server over stdio on `suite_files` (a process per connection)."""
    return suite_stdio_server(suite_files)


@pytest.fixture(scope="session")
def loopback_site() -> Iterator[LoopbackSite]:
    """A web page on 127.0.0.1 (`.url`); `.paths` lists every path asked for."""
    with serve_loopback_site() as site:
        yield site
