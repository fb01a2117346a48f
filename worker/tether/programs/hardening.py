"""Keeping what approves calls and what journals runs out of the tools' reach.

The model drives the tools; the processes that run them hold the webhook secret (it signs
approvals) and the model API keys, and Tether's own state (a run's journal, the dev stack's
secret file) sits in files. Nothing a tool can read or reach may resolve a call or rewrite a
journal, so:

- `make_undumpable()`: a process that holds a secret marks itself non-dumpable
  (`prctl(PR_SET_DUMPABLE, 0)`, Linux), so that a command of the same user id (the `shell`
  built-in) cannot read its `/proc/<pid>/environ`, `mem` or `maps`, nor attach to it. A child
  is dumpable again once it execs another program (the `shell` command's own environment holds
  none of the secrets). `tether.programs.worker.deadline` keeps its own copy: it runs as a bare
  script.
- `refuse_state_in_workspace()`: a journal or a secret file inside the directory the file
  tools may use is refused; `state_dir()` is where they go by default, outside any workspace.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from ..errors import ConfigError

PR_SET_DUMPABLE = 4


def make_undumpable() -> bool:
    """`prctl(PR_SET_DUMPABLE, 0)` on this process (Linux; elsewhere nothing). True if done.

    Besides `/proc` and ptrace, it turns off core dumps of this process."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def state_dir() -> Path:
    """Tether's state on this machine (the runs' journal, `tether dev`'s secret and logs):
    `$XDG_STATE_HOME/tether`, by default `~/.local/state/tether`. Never inside a workspace
    (`refuse_state_in_workspace`)."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "tether"


class StateInWorkspaceError(ConfigError):
    """Tether's state would sit where the file tools can read or rewrite it."""


def refuse_state_in_workspace(state: Path, workspace: Path, what: str, option: str) -> None:
    """Raise `StateInWorkspaceError` if `state` (a file or a directory, existing or not) is
    `workspace` or inside it, symbolic links followed."""
    target, root = state.resolve(), workspace.resolve()
    if target == root or root in target.parents:
        raise StateInWorkspaceError(
            f"{what} {target} is inside the workspace {root}, where the agent's file tools "
            f"could read or rewrite it: pass {option} outside the workspace (default: under "
            f"{state_dir()})"
        )


def tracker_environment(env: dict[str, str]) -> dict[str, str]:
    """What multiprocessing's resource tracker needs of `env` (see
    `start_resource_tracker_without_secrets`): the interpreter's own settings, no secret."""
    keep = ("PATH", "LANG", "TZ", "TMPDIR")
    return {k: v for k, v in env.items() if k in keep or k.startswith(("LC_", "PYTHON"))}


def start_resource_tracker_without_secrets() -> None:
    """Start multiprocessing's resource tracker now, with none of this process's secrets.

    The hypercorn CLI spawns its workers with multiprocessing, which first starts a resource
    tracker: a long-lived `python -c ...` process that inherits the environment (the webhook
    secret and the model keys), runs no code of ours, so stays dumpable, and needs none of it.
    Started here with a scrubbed environment, it is the one multiprocessing reuses. Call it
    while this process runs a single thread (the environment is swapped for the call)."""
    from multiprocessing import resource_tracker

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(tracker_environment(saved))
    try:
        resource_tracker.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)
