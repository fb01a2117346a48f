"""`tether.sandbox`: what a confined program is granted to start (`program_paths`), the
launcher's refusals, and the capabilities a confined process gives up. Real files and
processes; the MCP servers that use it are in tests/mcp/test_mcp_sandbox.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tether.sandbox.config import SYSTEM_PATHS, SandboxConfig
from tether.sandbox.launch import LAUNCH_ENV, Launch, program_paths
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
    assert program_paths([str(wrapper)], SYSTEM_PATHS, PATH) == [str(wrapper)]
    assert program_paths(["/bin/sh", "-c", "x"], SYSTEM_PATHS, PATH) == []
    env_s = script(tmp_path / "s2", "#!/usr/bin/env -S sh -e")  # the program after env's options
    assert program_paths([str(env_s)], SYSTEM_PATHS, PATH) == [str(env_s)]


def test_a_venv_is_granted_whole_with_the_python_it_was_made_from(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    tool = script(venv / "bin" / "server", f"#!{venv / 'bin' / 'python'}")
    granted = program_paths([str(tool)], SYSTEM_PATHS, PATH)
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
    granted = program_paths([str(in_home_bin)], SYSTEM_PATHS, PATH) + program_paths(
        [str(local)], SYSTEM_PATHS, PATH
    )
    assert granted == [str(in_home_bin), str(local)]  # their files alone
    # A script the command names by absolute path is granted, as a file.
    data = home / "server.py"
    data.write_text("")
    assert program_paths(["/usr/bin/python3", str(data)], SYSTEM_PATHS, PATH) == [str(data)]


def launcher(launch_json: str | None, cwd: str = "/") -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], **({LAUNCH_ENV: launch_json} if launch_json else {})}
    return subprocess.run(
        [sys.executable, "-I", "-m", "tether.sandbox"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_launcher_refuses_rather_than_run_anything_unconfined(tmp_path: Path) -> None:
    policy = SandboxConfig().policy(write=[str(tmp_path)])
    missing = Launch(policy, ("/no/such/program",), str(tmp_path)).to_json()
    done = launcher(missing)
    assert done.returncode == 127 and "cannot run /no/such/program" in done.stderr
    assert launcher(None).returncode == 2
    no_cwd = Launch(policy, ("/bin/true",), str(tmp_path / "gone")).to_json()
    done = launcher(no_cwd)
    assert done.returncode == 126 and "cannot confine" in done.stderr


def test_a_confined_program_holds_no_capability_and_only_its_environment(tmp_path: Path) -> None:
    """As root too: no capability survives the exec (CapEff, CapBnd), and the program sees the
    launch's environment, not the launcher's."""
    policy = Policy(read=tuple(SYSTEM_PATHS), write=(str(tmp_path),))
    argv = ("/bin/sh", "-c", "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; env; pwd")
    launch = Launch(policy, argv, str(tmp_path), {"ONLY": "this"})
    done = launcher(launch.to_json())
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    caps = {line.split(":")[0]: line.split()[1] for line in lines[:3]}
    assert caps == {"CapPrm": "0" * 16, "CapEff": "0" * 16, "CapBnd": "0" * 16}, caps
    assert "ONLY=this" in lines and not any(line.startswith(LAUNCH_ENV) for line in lines)
    assert not any(line.startswith("PATH=") for line in lines)
    assert lines[-1] == str(tmp_path)
