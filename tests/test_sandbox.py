"""`tether.sandbox`: what a confined program is granted to start (`program_paths`), the
launcher's refusals, and the capabilities a confined process gives up. Real files and
processes; the MCP servers that use it are in tests/mcp/test_mcp_sandbox.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tether.sandbox.config import SYSTEM_PATHS, SandboxConfig
from tether.sandbox.launch import Launch, program_paths
from tether.sandbox.policy import Policy

PATH = "/usr/local/bin:/usr/bin:/bin"


def script(path: Path, first_line: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{first_line}\necho hi\n")
    path.chmod(0o755)
    return path


def test_a_wrapper_of_a_system_shell_is_granted_its_file_not_the_root(tmp_path: Path) -> None:
    """`/bin/sh` is under the system's directories; the directory above its `bin/` is `/`."""
    wrapper = script(tmp_path / "srv" / "bin" / "wrapper", "#!/bin/sh")
    assert program_paths([str(wrapper)], SYSTEM_PATHS, PATH, None) == [str(wrapper)]
    assert program_paths(["/bin/sh", "-c", "x"], SYSTEM_PATHS, PATH, None) == []
    env_s = script(tmp_path / "s2", "#!/usr/bin/env -S sh -e")  # the program after env's options
    assert program_paths([str(env_s)], SYSTEM_PATHS, PATH, None) == [str(env_s)]


def test_a_venv_is_granted_whole_with_the_python_it_was_made_from(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    tool = script(venv / "bin" / "server", f"#!{venv / 'bin' / 'python'}")
    granted = program_paths([str(tool)], SYSTEM_PATHS, PATH, None)
    assert str(venv) in granted
    base = Path(sys.base_prefix)
    assert any(base == Path(p) or base.is_relative_to(p) for p in [*granted, *SYSTEM_PATHS])


def test_nothing_above_or_at_the_users_home_nor_its_state_is_granted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    in_home_bin = script(home / "bin" / "server", "#!/bin/sh")
    (home / "lib" / "node_modules").mkdir(parents=True)  # a marker: home/bin would be a prefix
    local = script(home / ".local" / "bin" / "tool", "#!/bin/sh")
    (home / ".local" / "lib" / "node_modules").mkdir(parents=True)
    granted = program_paths([str(in_home_bin)], SYSTEM_PATHS, PATH, None) + program_paths(
        [str(local)], SYSTEM_PATHS, PATH, None
    )
    assert granted == [str(in_home_bin), str(local)]  # their files alone
    # A script the command names by absolute path is granted, as a file.
    data = home / "server.py"
    data.write_text("")
    assert program_paths(["/usr/bin/python3", str(data)], SYSTEM_PATHS, PATH, None) == [str(data)]


def test_a_file_the_command_names_in_the_workspace_is_not_granted_through_a_link(
    tmp_path: Path,
) -> None:
    """The model may swap such a file for a link to anything the worker reads; the workspace
    is writable (so readable) anyway."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    secret = tmp_path / "token"
    secret.write_text("s3cr3t")
    (workspace / "data.db").symlink_to(secret)
    argv = ["/bin/cat", str(workspace / "data.db")]
    assert program_paths(argv, SYSTEM_PATHS, PATH, workspace) == []
    assert program_paths(argv, SYSTEM_PATHS, PATH, None) == [str(secret)]  # as resolved
    with pytest.raises(ValueError, match="is in the workspace"):
        program_paths(
            [str(script(workspace / "server", "#!/bin/sh"))], SYSTEM_PATHS, PATH, workspace
        )


def launcher(
    launch: Launch | None, env: dict[str, str] | None = None, prefix: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    environ = {"PATH": os.environ["PATH"], **(env or {})}
    if launch is not None:
        environ.update(launch.command()[1])
    return subprocess.run(
        [*prefix, sys.executable, "-I", "-m", "tether.sandbox"],
        env=environ,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_launcher_refuses_rather_than_run_anything_unconfined(tmp_path: Path) -> None:
    policy = SandboxConfig().policy(write=[str(tmp_path)])
    done = launcher(Launch(policy, ("/no/such/program",), str(tmp_path)))
    assert done.returncode == 127 and "cannot run /no/such/program" in done.stderr
    assert launcher(None).returncode == 2
    done = launcher(Launch(policy, ("/bin/true",), str(tmp_path / "gone")))
    assert done.returncode == 126 and "cannot confine" in done.stderr


def test_a_confined_program_holds_no_capability_and_only_its_environment(tmp_path: Path) -> None:
    """As root too: no capability survives the exec, inheritable ones included; the program
    sees the launch's variables, however large, and none of the launcher's; the launcher
    itself takes none of the program's as its own (an `LD_PRELOAD` would load code into it
    unconfined)."""
    policy = Policy(read=tuple(SYSTEM_PATHS), write=(str(tmp_path),))
    argv = ("/bin/sh", "-c", "grep -E '^Cap(Eff|Prm|Inh|Bnd)' /proc/self/status; env; pwd")
    large = "x" * 100_000  # twice, past the kernel's 128 KiB for one string were they one
    env = {"ONLY": "this", "LARGE": large, "LARGER": large, "LD_PRELOAD": "/no/such/library.so"}
    launch = Launch(policy, argv, str(tmp_path), env)
    launcher_env = launch.command()[1]
    assert all(name.startswith("TETHER_SANDBOX_") for name in launcher_env), launcher_env
    # Started holding an inheritable capability, which a file's +i would bring back at exec.
    inheritable = ["setpriv", "--inh-caps", "+dac_read_search"] if os.geteuid() == 0 else []
    done = launcher(launch, {"SEEN": "by the launcher"}, inheritable)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    caps = {line.split(":")[0]: line.split()[1] for line in lines[:4]}
    assert set(caps.values()) == {"0" * 16}, caps
    assert {"ONLY=this", f"LARGE={large}", "LD_PRELOAD=/no/such/library.so"} <= set(lines)
    assert not any(line.startswith(("TETHER_SANDBOX", "PATH=", "SEEN=")) for line in lines)
    assert lines[-1] == str(tmp_path)
