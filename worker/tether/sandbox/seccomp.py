"""A seccomp filter for what Landlock does not see: sockets of the protocols its TCP rules leave
out (Multipath TCP, SCTP, SMC: a connection to any port), Unix sockets (a path-named one is
reached from anywhere: docker.sock, the desktop's D-Bus, ssh-agent, journald), vsock (the
hypervisor's host) and io_uring (which makes sockets without the `socket` system call). A
stream `socketpair` stays open (a command's own processes talk through it); a datagram one,
which can be connected to any socket's path, does not.

Built once (`SocketFilter.build`), installed by the process it confines (`SocketFilter.install`:
one `prctl` on a program made before, after `syscalls.no_new_privs`), so a `shell` child installs
it between fork and exec."""

from __future__ import annotations

import ctypes
import errno
import platform
from dataclasses import dataclass

from .syscalls import prctl

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_LD_W_ABS, _JEQ_K, _JGE_K, _AND_K, _RET_K = 0x20, 0x15, 0x35, 0x54, 0x06
_X32 = 0x40000000
_RET_ALLOW = 0x7FFF0000
_RET_EACCES = 0x00050000 | errno.EACCES
_NR, _ARCH, _ARG0, _ARG1, _ARG2 = 0, 4, 16, 24, 32  # in struct seccomp_data (the low 32 bits)
_AF_UNIX, _AF_VSOCK, _AF_SMC = 1, 40, 43
_TYPE_MASK, _SOCK_DGRAM, _SOCK_SEQPACKET = 0xF, 2, 5  # the type without SOCK_CLOEXEC and such
_IPPROTO_SCTP, _IPPROTO_SMC, _IPPROTO_MPTCP = 132, 256, 262
_IO_URING_SETUP = 425  # the same on every architecture
_ARCHES = {  # machine: (AUDIT_ARCH_*, socket's number, socketpair's)
    "x86_64": (0xC000003E, 41, 53),
    "aarch64": (0xC00000B7, 198, 199),
}


class _Instruction(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


_Op = tuple[int, int | str, int | str, int]
"""An instruction: its code, where it jumps if true and if not (an offset or a label), its
constant."""


def _assemble(code: list[_Op | str]) -> ctypes.Array[_Instruction]:
    """Classic BPF from instructions whose jumps name labels (the strings in `code`)."""
    labels: dict[str, int] = {}
    program: list[_Op] = []
    for item in code:
        if isinstance(item, str):
            labels[item] = len(program)
        else:
            program.append(item)

    def offset(target: int | str, at: int) -> int:
        return target if isinstance(target, int) else labels[target] - at - 1

    made = [
        _Instruction(op, offset(jt, at), offset(jf, at), k)
        for at, (op, jt, jf, k) in enumerate(program)
    ]
    return (_Instruction * len(made))(*made)


def unenforced() -> list[str]:
    """What a filter cannot refuse on this machine, in words for a log."""
    machine = platform.machine()
    if machine in _ARCHES:
        return []
    unseen = "Unix, vsock, Multipath TCP, SCTP and SMC sockets, and io_uring"
    return [f"{unseen}: no seccomp filter for {machine}"]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Instruction))]


@dataclass
class SocketFilter:
    """A filter refusing (EACCES) the sockets above, or none on an architecture it does not
    know (`program` None)."""

    program: _Program | None
    instructions: ctypes.Array[_Instruction] | None  # what `program` points to, kept alive

    @classmethod
    def build(cls, unix_sockets: bool) -> SocketFilter:
        known = _ARCHES.get(platform.machine())
        if known is None:
            return cls(None, None)  # `unenforced` says so
        arch, socket_nr, socketpair_nr = known
        datagram_pairs: list[_Op] = [  # a datagram socket connects to any socket's path
            (_LD_W_ABS, 0, 0, _ARG1),
            (_AND_K, 0, 0, _TYPE_MASK),
            (_JEQ_K, "deny", 0, _SOCK_DGRAM),
        ]
        code: list[_Op | str] = [
            (_LD_W_ABS, 0, 0, _ARCH),
            (_JEQ_K, 0, "deny", arch),  # another ABI (i386 on x86_64): denied, all of it
            (_LD_W_ABS, 0, 0, _NR),
            (_JGE_K, "deny", 0, _X32),  # x32's numbers
            (_JEQ_K, "deny", 0, _IO_URING_SETUP),
            (_JEQ_K, "socketpair", 0, socketpair_nr),
            (_JEQ_K, 0, "allow", socket_nr),
            (_LD_W_ABS, 0, 0, _ARG0),  # the family
            (_JEQ_K, "allow" if unix_sockets else "deny", 0, _AF_UNIX),
            (_JEQ_K, "deny", 0, _AF_VSOCK),  # the hypervisor's host
            (_JEQ_K, "deny", 0, _AF_SMC),  # TCP underneath, out of Landlock's sight
            (_LD_W_ABS, 0, 0, _ARG1),  # the type
            (_AND_K, 0, 0, _TYPE_MASK),
            (_JEQ_K, "deny", 0, _SOCK_SEQPACKET),  # SCTP, when its module is loaded
            (_LD_W_ABS, 0, 0, _ARG2),  # the protocol
            (_JEQ_K, "deny", 0, _IPPROTO_MPTCP),
            (_JEQ_K, "deny", 0, _IPPROTO_SCTP),
            (_JEQ_K, "deny", "allow", _IPPROTO_SMC),
            "socketpair",
            *([] if unix_sockets else datagram_pairs),
            (_RET_K, 0, 0, _RET_ALLOW),
            "deny",
            (_RET_K, 0, 0, _RET_EACCES),
            "allow",
            (_RET_K, 0, 0, _RET_ALLOW),
        ]
        instructions = _assemble(code)
        return cls(_Program(len(instructions), instructions), instructions)

    def install(self) -> None:
        """Filter the calling process and what it starts."""
        if self.program is not None:
            program = ctypes.byref(self.program)
            prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, program, what="seccomp")
