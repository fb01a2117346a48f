"""Starting a program confined when other code starts the process (the `mcp` SDK starts stdio
servers itself): a `Launch` runs this package's launcher (`__main__`), which confines itself,
moves to the program's directory and execs it.

The launcher runs unconfined until then, so it takes none of the program's variables as its
own: the launch comes as JSON in `LAUNCH_ENV` and each of the program's variables under a name
of the launcher's (`VARIABLE_PREFIX<n>`, `NAME=value`: an `LD_PRELOAD` or `LD_LIBRARY_PATH` of the
spec's would load code into the launcher), and it starts in `/`, not in a directory the program
or the model writes. The program gets exactly the launch's variables.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import stat
import sys
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .policy import Policy

LAUNCH_ENV = "TETHER_SANDBOX_LAUNCH"
VARIABLE_PREFIX = "TETHER_SANDBOX_VARIABLE_"
_INSTALLATION_MARKERS = ("pyvenv.cfg", "lib/node_modules", "lib/python3*/os.py")
"""What makes the directory above a `bin/` a program's installation (a Python venv, a Node
prefix, a Python with its standard library), granted whole; any other program is granted its
file alone."""


@dataclass(frozen=True)
class Launch:
    """`argv` (its program an absolute path) confined to `policy`, in `cwd`, with exactly
    `env`."""

    policy: Policy
    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str] = field(default_factory=dict)

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The launcher's argv, this interpreter isolated from the PYTHON* variables and the
        user's site, and its environment."""
        launch = {**asdict(self.policy), "argv": self.argv, "cwd": self.cwd}
        environ = {LAUNCH_ENV: json.dumps(launch, separators=(",", ":"))}
        for number, (name, value) in enumerate(self.env.items()):
            environ[f"{VARIABLE_PREFIX}{number}"] = f"{name}={value}"
        return [sys.executable, "-I", "-m", "tether.sandbox"], environ

    @classmethod
    def taken_from(cls, environ: MutableMapping[str, str]) -> Launch:
        """The launch in a launcher's `environ`, which loses it and the program's variables."""
        data = json.loads(environ.pop(LAUNCH_ENV))
        variables = [name for name in environ if name.startswith(VARIABLE_PREFIX)]
        env = dict(environ.pop(name).split("=", 1) for name in variables)
        ports = data["connect_ports"]
        policy = Policy(
            read=tuple(data["read"]),
            write=tuple(data["write"]),
            connect_ports=None if ports is None else tuple(ports),
            unix_sockets=data["unix_sockets"] is True,
        )
        return cls(policy, tuple(data["argv"]), data["cwd"], env)


def refused_path_entries(search_path: str, workspace: Path | None) -> list[str]:
    """The entries of a PATH a confined program must not search: relative or empty ones (its
    working directory) and those in the workspace, where the model puts what it likes."""
    refused = []
    for entry in search_path.split(os.pathsep):
        real = Path(os.path.realpath(entry)) if os.path.isabs(entry) else None
        if real is None or (workspace is not None and real.is_relative_to(workspace)):
            refused.append(entry)
    return refused


def _programs_of(program: str, search_path: str) -> list[str]:
    """A program (an absolute path) and the interpreter its `#!` line names (through `env`:
    the one on `search_path`), each as named and as resolved."""
    named = [program, *_interpreter(program, search_path)]
    both = (path for name in named for path in (os.path.abspath(name), os.path.realpath(name)))
    return list(dict.fromkeys(both))


def program_paths(
    argv: Sequence[str], readable: Iterable[str], search_path: str, workspace: Path | None
) -> list[str]:
    """What a program (`argv[0]`, an absolute path) reads to start, beyond `readable`: the files
    of `_programs_of`, or the whole installation of one that has a marker (a venv, with the
    Python it was made from); and the files its arguments name by absolute path (a script), as
    resolved. Never `/`, the user's home or a directory above it, nor ~/.local or ~/.config
    (where the user's state and credentials are). A `ValueError` for a program in the
    `workspace`, the model's: it would run the model's code with the program's credentials."""
    readable = [os.path.join(p, "") for p in readable]
    granted: list[str] = []
    for path in _programs_of(argv[0], search_path):
        if workspace is not None and Path(path).is_relative_to(workspace):
            raise ValueError(
                f"its program {path} is in the workspace, which the agent's tools write"
            )
        if any(os.path.join(path, "").startswith(r) for r in readable):
            continue
        installation = [p for p in _installation(path) if not _too_broad(p)]
        granted.extend(installation or [path])
    for argument in argv[1:]:
        if not os.path.isabs(argument) or not os.path.isfile(argument):
            continue
        named, real = Path(os.path.abspath(argument)), os.path.realpath(argument)
        if workspace is None or not (
            named.is_relative_to(workspace) or Path(real).is_relative_to(workspace)
        ):
            granted.append(real)  # one in the workspace is writable anyway, and may be a link
    return list(dict.fromkeys(granted))


def _interpreter(program: str, search_path: str) -> list[str]:
    """The interpreter a `#!` line names (through `env`: that and the program it finds)."""
    first = b""
    with contextlib.suppress(OSError):
        fd = os.open(program, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # never a FIFO's wait
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                first = os.read(fd, 256).split(b"\n", 1)[0]
        finally:
            os.close(fd)
    if not first.startswith(b"#!"):
        return []
    words = [os.fsdecode(word) for word in first[2:].split()]
    if not words:
        return []
    if os.path.basename(words[0]) != "env":
        return [words[0]]
    named = [word for word in words[1:] if not word.startswith("-") and "=" not in word]
    found = shutil.which(named[0], path=search_path) if named else None
    return [words[0], *([found] if found else [])]


def _installation(path: str) -> list[str]:
    """The installation a program in a `bin/` belongs to, if it has a marker, with a venv's
    base Python (its `home`); else nothing."""
    directory = os.path.dirname(path)
    if os.path.basename(directory) != "bin":
        return []
    root = os.path.dirname(directory)
    if not any(glob.glob(glob.escape(root) + "/" + m) for m in _INSTALLATION_MARKERS):
        return []
    found = [root]
    with contextlib.suppress(OSError), open(os.path.join(root, "pyvenv.cfg")) as config:
        for line in config:
            key, _, value = line.partition("=")
            if key.strip() == "home" and os.path.basename(value.strip()) == "bin":
                found.append(os.path.dirname(value.strip()))  # the base Python's stdlib
    return found


def _too_broad(path: str) -> bool:
    home = os.path.expanduser("~")
    private = [os.path.join(home, ".local"), os.path.join(home, ".config")]
    inside = os.path.join(path, "")
    return os.path.join(home, "").startswith(inside) or any(
        os.path.join(p, "").startswith(inside) for p in private
    )
