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


_PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_CAP_AMBIENT, _AMBIENT_CLEAR_ALL = 24, 28, 47, 4
_CAP_SETPCAP = 8
_SECBIT_NOROOT, _SECBIT_NOROOT_LOCKED = 1 << 0, 1 << 1


@dataclass(frozen=True)
class Capabilities:
    """The capabilities this process holds, read before a fork (`current`), which `drop` gives
    up for whatever the process execs next."""

    effective: int
    last: int
    """The kernel's last capability number."""

    @classmethod
    def current(cls) -> Capabilities:
        with open("/proc/self/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        with open("/proc/sys/kernel/cap_last_cap") as last:
            return cls(int(fields["CapEff"], 16), int(last.read()))

    @property
    def unenforced(self) -> list[str]:
        """What `drop` cannot give up here, in words for a log."""
        if os.geteuid() == 0 and not self.effective >> _CAP_SETPCAP & 1:
            return ["capabilities: root without CAP_SETPCAP keeps them across exec"]
        return []

    def drop(self) -> None:
        """Whatever this process execs holds no capability, root included (`SECBIT_NOROOT`,
        an empty bounding set, no ambient ones): a root worker's tool cannot read other
        processes' memory or environment, nor change the network's rules. Only `prctl` calls
        on numbers read before (safe between fork and exec)."""
        with contextlib.suppress(OSError):  # no ambient capabilities before Linux 4.3
            prctl(_PR_CAP_AMBIENT, _AMBIENT_CLEAR_ALL, what="ambient capabilities")
        if not self.effective >> _CAP_SETPCAP & 1:
            return  # nothing to give up but for root, which `unenforced` reports
        prctl(_PR_SET_SECUREBITS, _SECBIT_NOROOT | _SECBIT_NOROOT_LOCKED, what="securebits")
        for capability in range(self.last + 1):
            prctl(_PR_CAPBSET_DROP, capability, what="capability bounding set")
