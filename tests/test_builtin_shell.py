"""`shell` confinement, with real processes: environment, resource limits, streamed output cap,
process-group kills."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import tool_context
from tether.sandbox import landlock
from tether.sandbox.config import SYSTEM_PATHS, SandboxConfig
from tether.tools import ToolError
from tether.tools.builtin import BUILTINS, Workspace
from tether.tools.builtin.shell import Sandbox, ShellConfig, run_command

MiB = 1024 * 1024


def build(config: dict[str, Any], root: Path) -> Any:
    return BUILTINS["shell"]("shell", config, Workspace(root))


async def run(config: dict[str, Any], root: Path, command: str) -> str:
    result: str = await build(config, root).execute({"command": command}, None)
    return result


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_dead(pid: int, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def pids() -> Iterator[list[int]]:
    """Pids a test saw: killed at the end whatever happened (nothing left behind by a failure)."""
    seen: list[int] = []
    yield seen
    for pid in seen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def environment(output: str) -> dict[str, str]:
    lines = output.split("\n", 1)[1].splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


async def test_shell_gets_none_of_the_worker_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_WEBHOOK_SECRET", "approve-me-secret")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret")
    result = await run({}, tmp_path, "env; pwd")
    assert "secret" not in result
    env = environment(result)
    env.pop("PWD", None)  # the shell's own
    assert env.pop("TMPDIR").startswith(f"{tempfile.gettempdir()}/tether-shell-")  # the sandbox's
    assert env == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
    }
    assert result.rstrip().endswith(f"\n{tmp_path}")  # pwd: the workspace


async def test_shell_gets_the_calls_idempotency_key(tmp_path: Path) -> None:
    """The same at every attempt of a call (`ToolContext.idempotency_key`), for the APIs the
    command calls; another for another call."""
    shell = build({}, tmp_path)

    async def key_of(call_id: str) -> str:
        ctx = tool_context(call_id)
        output = await shell.execute({"command": "env"}, ctx)
        assert environment(output)["TETHER_IDEMPOTENCY_KEY"] == ctx.idempotency_key
        return ctx.idempotency_key

    first = await key_of("call_0_0")
    assert await key_of("call_0_0") == first != await key_of("call_1_0")


async def test_shell_environment_comes_from_its_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_WEBHOOK_SECRET", "approve-me-secret")
    monkeypatch.setenv("GIT_TOKEN", "token-for-git")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    config = {"passEnv": ["GIT_TOKEN", "NOT_SET_ANYWHERE"], "env": {"LANG": "C", "MODE": "ci"}}
    env = environment(await run(config, tmp_path, "env"))
    env.pop("PWD", None)
    env.pop("TMPDIR")
    assert env == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C",
        "GIT_TOKEN": "token-for-git",
        "MODE": "ci",
    }


@pytest.mark.parametrize(
    ("config", "error"),
    [
        ({"passEnv": ["TETHER_WEBHOOK_SECRET"]}, "secret of the worker"),
        ({"passEnv": ["OPENAI_API_KEY"]}, "secret of the worker"),
        ({"passEnv": ["A-B"]}, "not an environment variable name"),
        ({"env": {"1X": "y"}}, "not an environment variable name"),
        ({"maxOutputBytes": 100, "killAfterOutputBytes": 10}, "at least maxOutputBytes"),
        ({"limits": {"cpuSeconds": 0}}, "greater than 0"),
        ({"limits": {"wallSeconds": 1}}, "Extra inputs"),
        ({"sandbox": {"readPaths": ["data"]}}, "not an absolute path"),
        ({"sandbox": {"connectPorts": [0]}}, "greater than or equal to 1"),
    ],
)
def test_shell_config_is_checked(config: dict[str, Any], error: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=error):
        build(config, tmp_path)


def limits_of(output: str) -> dict[str, tuple[str, str]]:
    """`/proc/self/limits` as {name: (soft, hard)}."""
    rows = output.splitlines()[2:]  # the exit code, the header
    return {row[:26].strip(): (row[26:47].strip(), row[47:68].strip()) for row in rows}


def expected(kind: int, value: int) -> str:
    """`value`, or the worker's hard limit when that is lower (the child cannot go above it)."""
    hard = resource.getrlimit(kind)[1]
    return str(value if hard == resource.RLIM_INFINITY else min(value, hard))


async def test_shell_has_resource_limits_by_default(tmp_path: Path) -> None:
    limits = limits_of(await run({"timeoutSeconds": 7.5}, tmp_path, "cat /proc/self/limits"))
    assert limits["Max cpu time"][0] == expected(resource.RLIMIT_CPU, 8)  # the timeout
    assert limits["Max address space"] == (expected(resource.RLIMIT_AS, 2048 * MiB),) * 2
    assert limits["Max file size"] == (expected(resource.RLIMIT_FSIZE, 1024 * MiB),) * 2
    assert limits["Max processes"] == (expected(resource.RLIMIT_NPROC, 1024),) * 2
    assert limits["Max core file size"] == ("0", "0")


async def test_shell_limits_come_from_its_config(tmp_path: Path) -> None:
    config = {
        "limits": {"cpuSeconds": 3, "memoryBytes": 300 * MiB, "fileSizeBytes": MiB, "processes": 50}
    }
    limits = limits_of(await run(config, tmp_path, "cat /proc/self/limits"))
    assert limits["Max cpu time"] == (expected(resource.RLIMIT_CPU, 3), "4")
    assert limits["Max address space"] == (expected(resource.RLIMIT_AS, 300 * MiB),) * 2
    assert limits["Max file size"] == (expected(resource.RLIMIT_FSIZE, MiB),) * 2
    assert limits["Max processes"] == (expected(resource.RLIMIT_NPROC, 50),) * 2
    # null: left as the worker has it
    unlimited = {"limits": {"memoryBytes": None}}
    limits = limits_of(await run(unlimited, tmp_path, "cat /proc/self/limits"))
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    shown = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    assert limits["Max address space"][1] == shown


async def test_shell_limits_stop_runaway_commands(tmp_path: Path) -> None:
    config = {
        "timeoutSeconds": 30,
        "limits": {"cpuSeconds": 1, "memoryBytes": 256 * MiB, "fileSizeBytes": MiB},
        "sandbox": {"readPaths": [*SYSTEM_PATHS, sys.prefix, sys.base_prefix]},  # this Python
    }
    started = time.monotonic()
    spin = await run(config, tmp_path, "while :; do :; done")
    assert spin == "exit code -24 (SIGXCPU)\n"
    assert time.monotonic() - started < 15  # long before the timeout
    await run(config, tmp_path, "head -c 3000000 /dev/zero > big")
    assert (tmp_path / "big").stat().st_size == MiB
    grab = f"{sys.executable} -c 'bytearray(512 * 1024 * 1024)'"
    assert "MemoryError" in await run(config, tmp_path, grab)
    # The command cannot raise its limits back (they are hard limits too), unless it may raise
    # any hard limit (CAP_SYS_RESOURCE, which a worker never has).
    if not may_raise_hard_limits():
        raised = await run(config, tmp_path, "ulimit -t unlimited && echo raised")
        assert "raised" not in raised


def may_raise_hard_limits() -> bool:
    status = Path("/proc/self/status").read_text()
    effective = int(status.split("CapEff:")[1].split()[0], 16)
    return bool(effective & (1 << 24))  # CAP_SYS_RESOURCE


async def test_shell_output_is_capped_while_it_streams(tmp_path: Path) -> None:
    """50 MB of output, 32 KiB kept: the worker never holds the rest."""
    tracemalloc.start()
    try:
        result = await run({}, tmp_path, "head -c 50000000 /dev/zero | tr '\\0' a; echo; echo end")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    head, tail = result.split("\n", 1)
    assert head == "exit code 0"
    total = 50_000_000 + len("\nend\n")
    assert tail.startswith(f"[... {total - 32 * 1024} bytes dropped ...]\naaaa")
    assert tail.endswith("aaaa\nend\n") and len(tail.split("\n", 1)[1]) == 32 * 1024
    assert peak < 8 * MiB, f"peak {peak} bytes"


async def test_shell_kills_a_command_that_floods_its_output(tmp_path: Path) -> None:
    config = {"timeoutSeconds": 30, "maxOutputBytes": 100, "killAfterOutputBytes": MiB}
    started = time.monotonic()
    result = await run(config, tmp_path, "yes")
    assert time.monotonic() - started < 10
    head, dropped, kept = result.split("\n", 2)
    assert head == f"output passed {MiB} bytes (killed)"
    assert dropped.startswith("[... ") and kept.endswith("y\n")


async def test_shell_kills_the_whole_group_on_timeout(tmp_path: Path, pids: list[int]) -> None:
    """A child forks a grandchild that would outlive the shell: the timeout kills it too."""
    command = "sh -c 'sleep 300 > /dev/null 2>&1 & echo $! > grandchild'; sleep 300"
    started = time.monotonic()
    result = await run({"timeoutSeconds": 1}, tmp_path, command)
    assert result == "timed out after 1 s (killed)"
    assert time.monotonic() - started < 10
    pids.append(int((tmp_path / "grandchild").read_text()))
    assert wait_dead(pids[-1])


async def test_shell_leaves_nothing_running_after_it_exits(tmp_path: Path, pids: list[int]) -> None:
    command = "sleep 300 > /dev/null 2>&1 & echo $! > background; echo started"
    assert await run({}, tmp_path, command) == "exit code 0\nstarted\n"
    pids.append(int((tmp_path / "background").read_text()))
    assert wait_dead(pids[-1])
    # A background job that holds the output does not make the call wait for its timeout.
    started = time.monotonic()
    assert await run({"timeoutSeconds": 20}, tmp_path, "sleep 300 & echo hi") == "exit code 0\nhi\n"
    assert time.monotonic() - started < 10


async def test_shell_does_not_read_the_worker_stdin(tmp_path: Path) -> None:
    assert await run({"timeoutSeconds": 5}, tmp_path, "cat; echo done") == "exit code 0\ndone\n"


async def test_shell_without_its_workspace_is_a_tool_error(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="cannot start the command"):
        await run({}, tmp_path / "missing", "true")


# The sandbox (Landlock) ---------------------------------------------------------------------

needs_landlock = pytest.mark.skipif(
    landlock.abi_version() < 6, reason="the kernel's Landlock is older than ABI 6 (Linux 6.12)"
)


@pytest.fixture
def shm() -> Iterator[Path]:
    """A file of the user's in /dev/shm: not the rest of /dev either."""
    path = Path("/dev/shm", f"tether-secret-{os.getpid()}")
    path.write_text("the user's")
    yield path
    path.unlink()


@needs_landlock
async def test_a_sandboxed_command_reads_and_writes_its_workspace_and_tmpdir_only(
    tmp_path: Path, shm: Path
) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("the worker's")
    planted = Path(tempfile.gettempdir(), f"tether-planted-{os.getpid()}")  # the worker's home
    script = (
        "echo mine > note && cat note && echo tmp > $TMPDIR/t && cat $TMPDIR/t && "
        f"ls /usr > /dev/null && echo system; cat {outside}/secret; echo x > {outside}/planted; "
        f"echo y > {planted}; cat {shm}"
    )
    output = await run({}, workspace, script)
    assert output.splitlines()[1:4] == ["mine", "tmp", "system"], output
    assert "the worker's" not in output and "the user's" not in output, output
    assert output.count("Permission denied") == 4, output
    assert not any(path.exists() for path in (outside / "planted", planted))

    unconfined = await run({"sandbox": {"enabled": False}}, workspace, f"cat {outside}/secret")
    assert "the worker's" in unconfined  # what the sandbox took away


CONNECT = """python3 - <<'PY'
import socket
for name, family, protocol, address in [
    ("tcp", socket.AF_INET, 0, ("127.0.0.1", {port})),
    ("tcp6", socket.AF_INET6, 0, ("::1", {port})),
    ("mptcp", socket.AF_INET, 262, ("127.0.0.1", {port})),  # Multipath TCP: not Landlock's
    ("unix", socket.AF_UNIX, 0, "{path}"),
]:
    try:
        socket.socket(family, socket.SOCK_STREAM, protocol).connect(address)
        print(name, "connected")
    except OSError as error:
        print(name, type(error).__name__)
PY"""


@needs_landlock
async def test_a_sandboxed_command_connects_only_to_its_ports(tmp_path: Path) -> None:
    """Restate's ingress (8080), its admin API and the worker's port are not among the default
    ports: a tool's command reaches none of them, over TCP, TCP over IPv6 or Multipath TCP
    (which Landlock's rules leave out: a seccomp filter refuses its sockets), nor a Unix
    socket (docker.sock, the desktop's D-Bus: Landlock cannot tell them apart)."""
    with (
        socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True) as server,
        socket.socket(socket.AF_UNIX) as unix,
    ):
        unix.bind(str(tmp_path / "agent.sock"))
        unix.listen()
        port = server.getsockname()[1]
        script = CONNECT.format(port=port, path=tmp_path / "agent.sock")

        async def outcomes(config: dict[str, Any]) -> dict[str, str]:
            output = await run(config, tmp_path, script)
            return dict(line.split(" ", 1) for line in output.splitlines()[1:])

        refused = dict.fromkeys(["tcp", "tcp6", "mptcp", "unix"], "PermissionError")
        assert await outcomes({}) == refused
        allowed = {"connectPorts": [port], "unixSockets": True}
        # Multipath TCP stays refused: Landlock cannot tell its ports.
        connected = dict.fromkeys(refused, "connected")
        assert await outcomes({"sandbox": allowed}) == {**connected, "mptcp": "PermissionError"}
        assert await outcomes({"sandbox": {"enabled": False}}) == connected  # what it took


@needs_landlock
async def test_a_sandboxed_command_signals_only_its_own_processes(tmp_path: Path) -> None:
    script = f"kill -0 {os.getpid()}; sleep 30 & kill $! && echo stopped its own"
    output = await run({}, tmp_path, script)
    assert "Operation not permitted" in output and "stopped its own" in output, output


@needs_landlock
async def test_a_sandboxed_command_holds_no_capability_and_reads_no_workers_environ(
    tmp_path: Path,
) -> None:
    """Under a root worker too: the command keeps no capability (root's CAP_SYS_PTRACE read
    the worker's /proc/<pid>/environ, its CAP_NET_ADMIN rewrote the network's rules)."""
    script = f"grep -E '^Cap(Eff|Bnd)' /proc/self/status; cat /proc/{os.getpid()}/environ"
    output = await run({}, tmp_path, script)
    assert f"CapEff:\t{'0' * 16}" in output and f"CapBnd:\t{'0' * 16}" in output, output
    assert "Permission denied" in output, output


async def test_what_the_kernel_cannot_confine_is_logged_or_refused_when_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(landlock, "abi_version", lambda: 0)  # a kernel without Landlock
    output = await run({}, tmp_path, "echo ran")
    assert output == "exit code 0\nran\n"
    assert "the sandbox cannot confine files, network and signals" in caplog.text
    with pytest.raises(ToolError, match="the sandbox is required and this kernel cannot"):
        await run({"sandbox": {"required": True}}, tmp_path, "echo ran")


@needs_landlock
async def test_a_closed_ruleset_refuses_to_start_a_command_rather_than_run_it_unconfined(
    tmp_path: Path,
) -> None:
    sandbox = Sandbox.of("sh", SandboxConfig(), tmp_path)
    sandbox.confinement.ruleset.close()
    with pytest.raises(ToolError, match="cannot start the command"):
        await run_command("true", ShellConfig(), tmp_path, sandbox=sandbox)


SOCKETS = """python3 - <<'PY'
import socket
for name, make in [
    ("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)),
    ("stream pair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)),
    ("datagram pair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)),
    ("unix", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)),
    ("vsock", lambda: socket.socket(40, socket.SOCK_STREAM)),
    ("smc", lambda: socket.socket(43, socket.SOCK_STREAM)),
    ("smc over inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 256)),
    ("sctp by its type", lambda: socket.socket(socket.AF_INET, socket.SOCK_SEQPACKET)),
]:
    try:
        make()
        print(name, "made", sep=":")
    except OSError as error:
        print(name, "refused" if error.errno == 13 else "unsupported", sep=":")
PY"""


async def test_the_sockets_landlock_does_not_see_are_refused_and_a_stream_pair_is_not(
    tmp_path: Path,
) -> None:
    """A datagram socketpair connects to any socket's path (journald, /dev/log); vsock reaches
    the hypervisor's host; SMC and SCTP carry connections Landlock's port rules never see."""
    output = await run({}, tmp_path, SOCKETS)
    made = dict(line.split(":") for line in output.splitlines()[1:])
    assert made == {
        "udp": "made",
        "stream pair": "made",
        **dict.fromkeys(
            ["datagram pair", "unix", "vsock", "smc", "smc over inet", "sctp by its type"],
            "refused",
        ),
    }, output
    allowed = await run({"sandbox": {"unixSockets": True}}, tmp_path, SOCKETS)
    assert "datagram pair:made" in allowed and "unix:made" in allowed, allowed
