"""The few Linux system calls Tether makes that Python's `os` has no function for
(Landlock's, `openat2`, `prctl`), through libc."""

from __future__ import annotations

import ctypes
import os

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
