"""The few Linux system calls Tether makes that Python's `os` has no function for
(Landlock's, `openat2`, `prctl`), through libc, and what they do with capabilities."""

from __future__ import annotations

import contextlib
import ctypes
import os
from dataclasses import dataclass

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_NO_NEW_PRIVS = 38


def syscall(number: int, *args: object, what: str) -> int:
    """syscall(2), its result or an `OSError` saying `what` failed. Every integer is passed as
    a C long: the kernel reads each argument as one."""
    longs = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    result = int(_libc.syscall(ctypes.c_long(number), *longs))
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")
    return result


def prctl(option: int, *args: object, what: str) -> None:
    """prctl(2) with up to four arguments (the rest 0), or an `OSError` saying `what` failed."""
    padded = [*args, 0, 0, 0, 0][:4]
    longs = [ctypes.c_long(a) if isinstance(a, int) else a for a in padded]
    if _libc.prctl(ctypes.c_int(option), *longs) < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def no_new_privs() -> None:
    """Neither this process nor what it starts gains privileges by exec (set-uid files), which
    Landlock and seccomp filters need of an unprivileged process."""
    prctl(_PR_SET_NO_NEW_PRIVS, 1, what="no_new_privs")


_PR_CAPBSET_DROP, _PR_GET_SECUREBITS, _PR_SET_SECUREBITS = 24, 27, 28
_PR_CAP_AMBIENT, _AMBIENT_CLEAR_ALL = 47, 4
_CAP_SETPCAP = 8
_SECBIT_NOROOT, _SECBIT_NOROOT_LOCKED = 1 << 0, 1 << 1
_CAPABILITY_V3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


@dataclass(frozen=True, eq=False)
class Capabilities:
    """The capabilities this process holds, read before a fork (`current`), which `drop` gives
    up for whatever the process execs next."""

    effective: int
    last: int
    """The kernel's last capability number."""
    securebits: int
    header: _CapHeader
    without_inheritable: ctypes.Array[_CapData]
    """This process's capabilities with an empty inheritable set, for `capset`."""

    @classmethod
    def current(cls) -> Capabilities:
        header, data = _CapHeader(_CAPABILITY_V3, 0), (_CapData * 2)()
        if _libc.capget(ctypes.byref(header), data) < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"capget: {os.strerror(error)}")
        for half in data:
            half.inheritable = 0
        with open("/proc/sys/kernel/cap_last_cap") as last:
            effective = data[0].effective | data[1].effective << 32
            securebits = int(_libc.prctl(ctypes.c_int(_PR_GET_SECUREBITS), 0, 0, 0, 0))
            return cls(effective, int(last.read()), max(securebits, 0), header, data)

    @property
    def unenforced(self) -> list[str]:
        """What `drop` cannot give up here, in words for a log."""
        if os.geteuid() == 0 and not self.effective >> _CAP_SETPCAP & 1:
            return ["capabilities: root without CAP_SETPCAP keeps them across exec"]
        return []

    def drop(self) -> None:
        """Whatever this process execs holds no capability, root included: no ambient or
        inheritable ones, an empty bounding set, `SECBIT_NOROOT` (unless a parent locked the
        bits): a root worker's tool cannot read other processes' memory or environment, nor
        change the network's rules. System calls on values made before (safe between fork
        and exec)."""
        with contextlib.suppress(OSError):  # no ambient capabilities before Linux 4.3
            prctl(_PR_CAP_AMBIENT, _AMBIENT_CLEAR_ALL, what="ambient capabilities")
        if _libc.capset(ctypes.byref(self.header), self.without_inheritable) < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"capset: {os.strerror(error)}")
        if not self.effective >> _CAP_SETPCAP & 1:
            return  # nothing more to give up but for root, which `unenforced` reports
        if not self.securebits & (_SECBIT_NOROOT | _SECBIT_NOROOT_LOCKED):
            bits = self.securebits | _SECBIT_NOROOT | _SECBIT_NOROOT_LOCKED
            prctl(_PR_SET_SECUREBITS, bits, what="securebits")
        for capability in range(self.last + 1):
            prctl(_PR_CAPBSET_DROP, capability, what="capability bounding set")
