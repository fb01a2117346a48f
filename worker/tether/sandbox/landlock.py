"""Landlock (Linux 5.13+): an unprivileged process gives up access to files, TCP ports and other
processes, for itself and everything it starts, for good.

A ruleset (`Ruleset.build`) holds the paths a program may read, those it may write, the TCP
ports it may connect to; and no process outside its own domain to signal or reach. Applying it
(`Ruleset.restrict_self`) is one system call on an open file descriptor, nothing to import, so a
`shell` child does it between fork and exec on a ruleset the worker built once. What a kernel
cannot enforce is left out and said (`unenforced`): TCP rules need ABI 4 (Linux 6.7), the scopes
ABI 6 (Linux 6.12).
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .syscalls import syscall

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_VERSION = 1 << 0  # landlock_create_ruleset's flag: return the ABI version
_PATH_BENEATH, _NET_PORT = 1, 2

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ABI1_FS = (1 << 13) - 1  # execute .. make_sym
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | _TRUNCATE | _IOCTL_DEV
"""The only rights a rule on a file (not a directory) may grant."""
READ = EXECUTE | READ_FILE | READ_DIR
_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPort(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def abi_version() -> int:
    """The kernel's Landlock ABI: 0 without Landlock (too old, not enabled at boot, or a
    seccomp profile that refuses its calls)."""
    try:
        return syscall(_CREATE_RULESET, None, 0, _VERSION, what="landlock: its version")
    except OSError:
        return 0


def unenforced(connect_ports: Sequence[int] | None, abi: int | None = None) -> list[str]:
    """What a ruleset restricting TCP to `connect_ports` (None: not at all) cannot enforce on
    this kernel (or at `abi`), in words for a log."""
    abi = abi_version() if abi is None else abi
    if abi == 0:
        return ["files, network and signals: the kernel has no Landlock"]
    missing = []
    if connect_ports is not None and abi < 4:
        missing.append(f"TCP connections: Landlock ABI {abi}, they need 4 (Linux 6.7)")
    if abi < 6:
        missing.append(f"signals: Landlock ABI {abi}, they need 6 (Linux 6.12)")
    return missing


def _fs_rights(abi: int) -> int:
    rights = _ABI1_FS
    rights |= _REFER if abi >= 2 else 0
    rights |= _TRUNCATE if abi >= 3 else 0
    return rights | (_IOCTL_DEV if abi >= 5 else 0)


@dataclass
class Ruleset:
    """An open Landlock ruleset (`fd`), or none when the kernel has no Landlock (`fd` -1)."""

    fd: int
    abi: int

    @classmethod
    def build(
        cls,
        read: Iterable[Path],
        write: Iterable[Path],
        connect_ports: Sequence[int] | None,
    ) -> Ruleset:
        """Reads beneath `read` (and `write`), writes beneath `write`, TCP connections to
        `connect_ports` only (None: any), and no signal to nor abstract Unix socket of a process
        outside the domain. Paths that do not exist are skipped."""
        abi = abi_version()
        if abi == 0:
            return cls(-1, 0)
        fs = _fs_rights(abi)
        net = _CONNECT_TCP if connect_ports is not None and abi >= 4 else 0
        scopes = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
        attr = _RulesetAttr(fs, net, scopes)
        fd = syscall(
            _CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0, what="landlock: ruleset"
        )
        ruleset = cls(fd, abi)
        try:
            for path in write:
                ruleset._allow(path, fs)
            for path in read:
                ruleset._allow(path, READ)
            for port in connect_ports if net and connect_ports else ():
                rule = _NetPort(_CONNECT_TCP, port)
                syscall(_ADD_RULE, fd, _NET_PORT, ctypes.byref(rule), 0, what=f"landlock: {port}")
        except BaseException:
            ruleset.close()
            raise
        return ruleset

    def _allow(self, path: Path, rights: int) -> None:
        try:
            parent = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            if not stat.S_ISDIR(os.fstat(parent).st_mode):
                rights &= FILE_RIGHTS
            rule = _PathBeneath(rights, parent)
            rule_ref = ctypes.byref(rule)
            syscall(_ADD_RULE, self.fd, _PATH_BENEATH, rule_ref, 0, what=f"landlock: {path}")
        finally:
            os.close(parent)

    def restrict_self(self) -> None:
        """Confine the calling process and what it starts (in a child between fork and exec,
        after `syscalls.no_new_privs`): no import, no allocation beyond the call's integers. A
        closed ruleset (its `fd` -1) fails: a command never runs unconfined by mistake."""
        if self.abi == 0:  # no Landlock: `unenforced` says so
            return
        syscall(_RESTRICT_SELF, self.fd, 0, what="landlock: restrict_self")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
