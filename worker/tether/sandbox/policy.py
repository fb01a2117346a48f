"""What a confined program may reach (`Policy`), and confining a process to it (`Confinement`).

A policy is plain data, so it crosses into another process as JSON: the launcher (`__main__`)
confines itself to one and execs the program. `shell` builds the `Confinement` once and applies
it in each command's child between fork and exec.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from . import landlock, seccomp
from .syscalls import no_new_privs


@dataclass(frozen=True)
class Policy:
    """Reads beneath `read` and `write`, writes beneath `write`, TCP connections only to
    `connect_ports` (None: any); Unix sockets only with `unix_sockets`."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    connect_ports: tuple[int, ...] | None = ()
    unix_sockets: bool = False

    @property
    def unenforced(self) -> list[str]:
        """What this kernel cannot confine of the policy, in words for a log."""
        return [*landlock.unenforced(self.connect_ports), *seccomp.unenforced()]

    def confinement(self) -> Confinement:
        ruleset = landlock.Ruleset.build(
            read=[Path(p) for p in self.read],
            write=[Path(p) for p in self.write],
            connect_ports=self.connect_ports,
        )
        return Confinement(ruleset, seccomp.SocketFilter.build(self.unix_sockets))

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Policy:
        data = json.loads(text)
        ports = data["connect_ports"]
        return cls(
            read=tuple(data["read"]),
            write=tuple(data["write"]),
            connect_ports=None if ports is None else tuple(ports),
            unix_sockets=bool(data["unix_sockets"]),
        )

    def launcher(self, argv: Sequence[str]) -> list[str]:
        """The argv that runs `argv` confined to this policy: this interpreter, isolated from
        the environment's PYTHON* variables, runs the launcher, which execs `argv`."""
        return [sys.executable, "-I", "-m", "tether.sandbox", self.to_json(), "--", *argv]


@dataclass
class Confinement:
    """A policy made into what the kernel takes: a Landlock ruleset and a socket filter."""

    ruleset: landlock.Ruleset
    sockets: seccomp.SocketFilter

    @property
    def unenforced(self) -> list[str]:
        return [*self.ruleset.unenforced, *self.sockets.unenforced]

    def apply(self) -> None:
        """Confine the calling process and what it starts, for good: a few system calls on
        values made before, nothing to import (safe between fork and exec)."""
        no_new_privs()
        self.ruleset.restrict_self()
        self.sockets.install()

    def close(self) -> None:
        self.ruleset.close()


def program_paths(argv: Sequence[str], search_path: str) -> list[str]:
    """What a program reads to start, besides the system's directories: the installation of its
    executable and of the interpreter its `#!` line names (the directory above a `bin/`: a
    venv, a prefix; else the directory itself), each as found and as resolved, and the files
    its arguments name by absolute path (a script)."""
    found = shutil.which(argv[0], path=search_path) if argv else None
    programs = [found] if found else []
    if found:
        first = b""
        with contextlib.suppress(OSError), open(found, "rb") as file:
            first = file.readline(256)
        if first.startswith(b"#!"):
            interpreter = [os.fsdecode(word) for word in first[2:].split()]
            programs.extend(interpreter[:1])
            if interpreter[:1] == ["/usr/bin/env"] and len(interpreter) > 1:  # env python3
                programs.extend(filter(None, [shutil.which(interpreter[1], path=search_path)]))
    paths: list[str] = []
    for program in programs:
        for path in (os.path.abspath(program), os.path.realpath(program)):
            directory = os.path.dirname(path)
            home = os.path.dirname(directory) if os.path.basename(directory) == "bin" else directory
            paths.append(home)
    paths.extend(a for a in argv[1:] if os.path.isabs(a) and os.path.isfile(a))
    return list(dict.fromkeys(paths))
