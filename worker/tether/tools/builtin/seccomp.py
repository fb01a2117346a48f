"""A seccomp filter for what Landlock does not see: sockets of the protocols its TCP rules leave
out (Multipath TCP, SCTP: a connection to any port), Unix sockets (a path-named one is reached
from anywhere: docker.sock, the desktop's D-Bus, ssh-agent) and io_uring (which makes sockets
without the `socket` system call). `socketpair` stays open: a command's own processes talk
through it.

Built once in the worker (`SocketFilter.build`), installed by the child between fork and exec
(`SocketFilter.install`: one `prctl` on a program made before the fork)."""

from __future__ import annotations

import ctypes
import errno
import platform
from dataclasses import dataclass

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_X32 = 0x40000000
_RET_ALLOW = 0x7FFF0000
_RET_EACCES = 0x00050000 | errno.EACCES
_NR, _ARCH, _ARG0, _ARG2 = 0, 4, 16, 32  # offsets in struct seccomp_data (the low 32 bits)
_AF_UNIX = 1
_IPPROTO_SCTP, _IPPROTO_MPTCP = 132, 262
_IO_URING_SETUP = 425  # the same on every architecture
_ARCHES = {  # machine: (AUDIT_ARCH_*, socket's number)
    "x86_64": (0xC000003E, 41),
    "aarch64": (0xC00000B7, 198),
}

_libc = ctypes.CDLL(None, use_errno=True)


class _Instruction(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Instruction))]


@dataclass
class SocketFilter:
    """A filter refusing (EACCES) the sockets above, or none on an architecture it does not
    know (`program` None)."""

    program: _Program | None
    instructions: ctypes.Array[_Instruction] | None  # what `program` points to, kept alive
    machine: str

    @classmethod
    def build(cls, unix_sockets: bool) -> SocketFilter:
        machine = platform.machine()
        known = _ARCHES.get(machine)
        if known is None:
            return cls(None, None, machine)
        arch, socket_nr = known
        # Each jump skips to `deny` (the last but one) or `allow` (the last), counted from the
        # instruction after it.
        code = [
            (_LD_W_ABS, 0, 0, _ARCH),
            (_JEQ_K, 0, 9, arch),  # another ABI (i386 on x86_64): denied, all of it
            (_LD_W_ABS, 0, 0, _NR),
            (_JGE_K, 7, 0, _X32),  # x32's numbers
            (_JEQ_K, 6, 0, _IO_URING_SETUP),
            (_JEQ_K, 0, 6, socket_nr),
            (_LD_W_ABS, 0, 0, _ARG0),
            (_JEQ_K, 0 if unix_sockets else 3, 0, _AF_UNIX),
            (_LD_W_ABS, 0, 0, _ARG2),
            (_JEQ_K, 1, 0, _IPPROTO_MPTCP),
            (_JEQ_K, 0, 1, _IPPROTO_SCTP),
            (_RET_K, 0, 0, _RET_EACCES),
            (_RET_K, 0, 0, _RET_ALLOW),
        ]
        instructions = (_Instruction * len(code))(*(_Instruction(*i) for i in code))
        return cls(_Program(len(code), instructions), instructions, machine)

    def install(self) -> None:
        """Filter the calling process and what it starts."""
        if self.program is None:
            return
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            raise OSError(ctypes.get_errno(), "seccomp: no_new_privs")
        if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(self.program), 0, 0):
            raise OSError(ctypes.get_errno(), "seccomp: install the socket filter")
