"""What a confined program may reach (`Policy`), and confining a process to it (`Confinement`).

`shell` builds the confinement once and applies it in each command's child between fork and
exec; the launcher (`launch`, `__main__`) applies it to itself and execs the program.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import landlock, seccomp
from .syscalls import Capabilities, no_new_privs


@dataclass(frozen=True)
class Policy:
    """Reads beneath `read` and `write`, writes beneath `write`, TCP connections only to
    `connect_ports` (None: any); Unix sockets only with `unix_sockets`. Never a capability,
    root's included."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    connect_ports: tuple[int, ...] | None = ()
    unix_sockets: bool = False

    @property
    def unenforced(self) -> list[str]:
        """What this kernel (and this process's capabilities) cannot confine of the policy, in
        words for a log."""
        return [
            *landlock.unenforced(self.connect_ports),
            *seccomp.unenforced(),
            *Capabilities.current().unenforced,
        ]

    def confinement(self) -> Confinement:
        ruleset = landlock.Ruleset.build(
            read=[Path(p) for p in self.read],
            write=[Path(p) for p in self.write],
            connect_ports=self.connect_ports,
        )
        sockets = seccomp.SocketFilter.build(self.unix_sockets)
        return Confinement(ruleset, sockets, Capabilities.current())


@dataclass
class Confinement:
    """A policy made into what the kernel takes: a Landlock ruleset, a socket filter, and the
    capabilities to give up."""

    ruleset: landlock.Ruleset
    sockets: seccomp.SocketFilter
    capabilities: Capabilities

    def apply(self) -> None:
        """Confine the calling process and what it starts, for good: a few system calls on
        values made before, nothing to import (safe between fork and exec)."""
        no_new_privs()
        self.capabilities.drop()
        self.ruleset.restrict_self()
        self.sockets.install()

    def close(self) -> None:
        self.ruleset.close()
