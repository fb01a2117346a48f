"""`shell`: a command in a subprocess, with a timeout, an output cap and resource limits.

What the command gets:
- its working directory is the workspace, its stdin is /dev/null;
- an environment of its own, not the worker's: `PATH` (the system directories), `HOME` (the
  workspace), `LANG=C.UTF-8`, `TETHER_IDEMPOTENCY_KEY` (the call's `ToolContext.idempotency_key`,
  the same at every attempt of the call: `curl -H "Idempotency-Key: $TETHER_IDEMPOTENCY_KEY"`
  makes an API act once), then the names listed in `config.passEnv` copied from the worker's
  environment (when set there), then the literal `config.env` values (which win). The worker's
  secrets (`TETHER_WEBHOOK_SECRET`, the model API keys) cannot be passed: with the secret that
  signs approvals, an agent could approve its own calls;
- resource limits (`setrlimit`, hard and soft, so the command cannot raise them again) on every
  process it starts: CPU seconds (default: the timeout, rounded up), address space (2 GiB), size
  of a file it writes (1 GiB), processes (1024) and no core files. `config.limits` overrides
  them; `null` leaves one as the worker has it. Linux counts processes per user id, so the
  worker's own threads and every process of that user id on the node (containers without a user
  namespace share the count) count against the limit: the pod's PID limit is the real guard
  against a fork bomb. Address space is virtual memory: runtimes that reserve large ranges
  (a JVM, some Go or Node programs) may need more;
- its own process group (session): on timeout, on cancellation and when the shell exits, the
  whole group is killed, so nothing it started in the background outlives the call;
- its output (stdout and stderr together) is read while it is written and only the last
  `maxOutputBytes` are kept (the result says how many bytes were dropped before them). Output
  past the cap is read and thrown away, so a chatty command neither blocks on a full pipe nor
  grows the worker's memory; once it passes `killAfterOutputBytes` (64 MiB) the command is
  killed: that is a runaway, and reading it on only burns the worker's CPU until the timeout;
- a sandbox (`config.sandbox`, `tether.sandbox`: Landlock and a seccomp filter), on by default:
  the command and all it starts read only the system's directories (`readPaths`) and the
  workspace, write only the workspace and the tool's temporary directory, shared by its commands
  (`TMPDIR`; not /tmp, where the worker keeps its home and caches in a pod), connect over TCP
  only to `connectPorts` (53, 80 and 443: not Restate's ingress, whose handlers take requests
  from anyone who reaches them, nor the admin API, nor the worker's port), open no Unix, vsock,
  Multipath TCP, SCTP or SMC socket, neither signal nor reach over abstract Unix sockets any
  process but their own (the worker included), and hold no capability (root's included). What
  the kernel cannot enforce is logged once as the tool is made (TCP rules need Linux 6.7, the
  scopes 6.12); `required: true` refuses to run a command the kernel cannot confine so.

What it does NOT confine: the command runs as the worker's user. Without the sandbox (or where
the kernel has no Landlock) it can read any file that user can read by absolute path, write
wherever that user can write and reach whatever the pod's network reaches. UDP is not confined
(DNS works), nor are the system's directories' readable files. A process that leaves the group
(`setsid`) escapes the kill (not the CPU limit or the sandbox). The container stays the
boundary: a read-only root filesystem, a non-root user without capabilities, a NetworkPolicy on
the pod's egress; gate the tool with `requireApproval` where that is not enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from ...sandbox.config import SandboxConfig
from ...sandbox.policy import Confinement
from ...secret_env import WORKER_SECRET_ENV
from ..base import ToolContext, ToolDef, ToolError
from ..decorator import tool

log = logging.getLogger(__name__)

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MiB = 1024 * 1024


class _Config(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class ShellLimits(_Config):
    """`config.limits` of the shell built-in: rlimits of every process the command starts."""

    cpu_seconds: int | None = Field(
        default=None, gt=0, description="CPU seconds per process (default: the timeout)."
    )
    memory_bytes: int | None = Field(
        default=2048 * MiB, gt=0, description="Address space per process (RLIMIT_AS)."
    )
    file_size_bytes: int | None = Field(
        default=1024 * MiB, ge=0, description="Largest file a process may write (RLIMIT_FSIZE)."
    )
    processes: int | None = Field(
        default=1024, gt=0, description="Processes of the worker's user id (RLIMIT_NPROC)."
    )


class ShellConfig(_Config):
    """`config` of the shell built-in."""

    timeout_seconds: float = Field(default=60, gt=0)
    max_output_bytes: int = Field(default=32 * 1024, gt=0)
    kill_after_output_bytes: int = Field(
        default=64 * MiB, gt=0, description="Kill a command whose output passes this."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Literal environment variables of the command."
    )
    pass_env: list[str] = Field(
        default_factory=list, description="Worker environment variables passed through by name."
    )
    limits: ShellLimits = Field(default_factory=ShellLimits)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if "\0" in text:
                raise ValueError(f"the value of {name} holds a NUL byte")
        return value

    @field_validator("pass_env")
    @classmethod
    def _pass_env_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name in WORKER_SECRET_ENV:  # never handed to a command (module docstring)
                raise ValueError(
                    f"{name} is a secret of the worker and is never passed to a command "
                    "(with it the agent could act as the worker); give the command a "
                    "credential of its own under another name"
                )
        return value

    @model_validator(mode="after")
    def _kill_past_the_cap(self) -> ShellConfig:
        if self.kill_after_output_bytes < self.max_output_bytes:
            raise ValueError("killAfterOutputBytes must be at least maxOutputBytes")
        return self


def keep_tail(output: bytes | bytearray, limit: int, total: int | None = None) -> str:
    """The last `limit` bytes, with a marker saying how many were dropped from the head.

    `total` is the length of the whole output when `output` is already only its tail."""
    tail = output[-limit:] if len(output) > limit else output
    dropped = (len(output) if total is None else total) - len(tail)
    text = bytes(tail).decode(errors="replace")
    return f"[... {dropped} bytes dropped ...]\n{text}" if dropped > 0 else text


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


IDEMPOTENCY_KEY_ENV = "TETHER_IDEMPOTENCY_KEY"


def child_env(
    settings: ShellConfig, workdir: str | Path, idempotency_key: str | None = None
) -> dict[str, str]:
    """The whole environment of a command: nothing of the worker's but what the config names,
    and the call's idempotency key."""
    env = {"PATH": SAFE_PATH, "HOME": str(Path(workdir).absolute()), "LANG": "C.UTF-8"}
    if idempotency_key is not None:
        env[IDEMPOTENCY_KEY_ENV] = idempotency_key
    env.update({name: os.environ[name] for name in settings.pass_env if name in os.environ})
    env.update(settings.env)
    return env


def rlimits(settings: ShellConfig) -> list[tuple[int, tuple[int, int]]]:
    """(resource, (soft, hard)) for the child, never above the worker's own hard limits (which
    an unprivileged process cannot raise)."""
    limits = settings.limits
    cpu = limits.cpu_seconds or math.ceil(settings.timeout_seconds)
    wanted = [
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_FSIZE, limits.file_size_bytes),
        (resource.RLIMIT_NPROC, limits.processes),
        (resource.RLIMIT_CORE, 0),
    ]
    result = []
    for kind, value in wanted:
        if value is None:
            continue
        # CPU: the soft limit sends SIGXCPU (which a process may catch), the hard one SIGKILL.
        pair = (value, value + 1 if kind == resource.RLIMIT_CPU else value)
        _, ceiling = resource.getrlimit(kind)
        if ceiling != resource.RLIM_INFINITY:
            pair = (min(pair[0], ceiling), min(pair[1], ceiling))
        result.append((kind, pair))
    return result


@dataclass
class Sandbox:
    """A shell tool's confinement, what of it this kernel cannot enforce, and the temporary
    directory all its commands share (their `TMPDIR`)."""

    confinement: Confinement
    unenforced: list[str]
    tmpdir: str
    required: bool

    @classmethod
    def of(cls, name: str, settings: SandboxConfig, workdir: str | Path) -> Sandbox:
        tmpdir = tempfile.mkdtemp(prefix="tether-shell-")
        policy = settings.policy(write=[str(workdir), tmpdir])
        confinement = policy.confinement()
        sandbox = cls(confinement, policy.unenforced, tmpdir, settings.required)
        for what in sandbox.unenforced:
            log.warning("shell tool %s: the sandbox cannot confine %s", name, what)
        # Gone with the last tool that holds it: the ruleset's descriptor and the directory.
        weakref.finalize(sandbox, confinement.close)
        weakref.finalize(sandbox, shutil.rmtree, tmpdir, ignore_errors=True)
        return sandbox


def _apply(limits: list[tuple[int, tuple[int, int]]], sandbox: Sandbox | None) -> None:
    """Runs in the child between fork and exec (`preexec_fn`): only setrlimit calls and the
    sandbox's few system calls, on values made before the fork, no import, no lock, which is
    what makes `preexec_fn` safe enough in a threaded worker."""
    for kind, pair in limits:
        resource.setrlimit(kind, pair)
    if sandbox is not None:
        sandbox.confinement.apply()


class _Output(asyncio.Protocol):
    """Reads the command's output pipe as it comes, keeping only its tail."""

    def __init__(self, keep: int, kill_after: int, on_flood: Callable[[], None]) -> None:
        self.keep = keep
        self.kill_after = kill_after
        self.on_flood = on_flood
        self.transport: asyncio.BaseTransport | None = None
        self.tail = bytearray()
        self.total = 0
        self.flooded = False
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.total += len(data)
        self.tail += data
        del self.tail[: -self.keep]  # nothing when the tail is still shorter than `keep`
        if self.total > self.kill_after and not self.flooded:
            self.flooded = True
            self.on_flood()
            if self.transport is not None:
                self.transport.close()  # stop reading: any writer left gets EPIPE

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def text(self) -> str:
        return keep_tail(self.tail, self.keep, self.total)


def _exit_status(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"exit code {code} ({signal.Signals(-code).name})"
    return f"exit code {code}"


async def run_command(
    command: str,
    settings: ShellConfig,
    workdir: str | Path,
    idempotency_key: str | None = None,
    sandbox: Sandbox | None = None,
) -> str:
    """Run `command` confined as the module docstring says; the text the model sees."""
    loop = asyncio.get_running_loop()
    limits = rlimits(settings)
    env = child_env(settings, workdir, idempotency_key)
    if sandbox is not None:
        if sandbox.required and sandbox.unenforced:
            unenforced = "; ".join(sandbox.unenforced)
            raise ToolError(f"the sandbox is required and this kernel cannot confine {unenforced}")
        env.setdefault("TMPDIR", sandbox.tmpdir)
    read_fd, write_fd = os.pipe()  # our own pipe: we read it as it fills and close it at will
    try:
        process = await asyncio.create_subprocess_shell(
            command,
            cwd=workdir,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            start_new_session=True,  # its own process group, so a kill reaches all of it
            preexec_fn=functools.partial(_apply, limits, sandbox),
        )
    except (OSError, subprocess.SubprocessError) as error:  # no such workspace, a bad limit
        os.close(read_fd)
        raise ToolError(f"cannot start the command: {error}") from None
    finally:
        os.close(write_fd)  # the child has its copies; EOF comes when every writer is gone
    try:
        transport, output = await loop.connect_read_pipe(
            lambda: _Output(
                settings.max_output_bytes,
                settings.kill_after_output_bytes,
                lambda: kill_group(process.pid),  # far past the cap: a runaway
            ),
            os.fdopen(read_fd, "rb", buffering=0),
        )
    except BaseException:  # cancelled here included: leave nothing running
        kill_group(process.pid)
        raise
    try:
        async with asyncio.timeout(settings.timeout_seconds):
            await process.wait()
            kill_group(process.pid)  # what it left running in the background
            await output.closed
    except TimeoutError:
        if process.returncode is None:  # the command itself ran out of time
            kill_group(process.pid)
            await process.wait()
            return f"timed out after {settings.timeout_seconds:g} s (killed)"
        # It exited, but a process that left its group (setsid) still holds the output open.
        note = "\n[... a detached process kept the output open; stopped reading ...]"
        return f"{_exit_status(process.returncode)}\n{output.text()}{note}"
    except asyncio.CancelledError:  # the run was aborted: leave nothing running
        kill_group(process.pid)
        raise
    finally:
        transport.close()
    if output.flooded:
        limit = settings.kill_after_output_bytes
        return f"output passed {limit} bytes (killed)\n{output.text()}"
    assert process.returncode is not None
    return f"{_exit_status(process.returncode)}\n{output.text()}"


def shell_tool(name: str, config: dict[str, Any], workdir: str | Path) -> ToolDef:
    settings = ShellConfig.model_validate(config)
    sandbox = Sandbox.of(name, settings.sandbox, workdir) if settings.sandbox.enabled else None

    @tool(name=name)
    async def shell(
        command: Annotated[str, Field(description="A /bin/sh command line.")],
        ctx: ToolContext | None = None,
    ) -> str:
        """Run a shell command in the workspace; returns its exit code and combined output."""
        key = ctx.idempotency_key if ctx is not None else None
        return await run_command(command, settings, workdir, key, sandbox)

    return shell
