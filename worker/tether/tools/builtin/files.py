"""File tools confined to a workspace directory.

Each file is opened beneath the workspace in one system call (`openat2` with
`RESOLVE_BENEATH`, Linux 5.6+): a path that leaves it, by `..` or by a symlink, is refused by
the kernel as it resolves it. A check of the path before opening it (`Path.resolve`) is not
enough: a command of the agent's may swap a checked file for a symlink to `/proc/self/environ`
(the worker's own secrets) between the check and the open. Without `openat2` (an older kernel, a
seccomp profile that refuses it) the parent directory is opened and checked through its
descriptor, and the file opened in it without following a symlink.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from pydantic import Field

from ...sandbox.syscalls import syscall
from ..base import ToolDef, ToolError
from ..decorator import tool

MAX_READ_BYTES = 256 * 1024
MAX_PATH_CHARS = 1024
RelativePath = Annotated[str, Field(description="Path relative to the workspace.")]

_OPENAT2 = 437  # the same on every architecture
_RESOLVE_NO_MAGICLINKS, _RESOLVE_BENEATH = 0x02, 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class Workspace:
    """A directory that tools may not leave (no absolute paths, no `..` escapes, no symlinks
    out)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def check(self, relative: str) -> None:
        """Refuse, with a plain message, a path that is too long or leaves the workspace as it
        is now (the open checks again, as it resolves the path)."""
        if len(relative) > MAX_PATH_CHARS:
            raise ToolError(f"the path is longer than {MAX_PATH_CHARS} characters")
        with plainly(relative):
            target = (self.root / relative).resolve()
        if not self._inside(target):
            raise ToolError(f"{relative!r} is outside the workspace")

    def _inside(self, path: Path) -> bool:
        return path == self.root or self.root in path.parents

    def open(self, relative: str, flags: int, mode: int = 0o644) -> int:
        """A descriptor of `relative`, opened beneath the workspace (the module says how)."""
        self.check(relative)
        root = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return self._beneath(root, relative, flags | os.O_CLOEXEC, mode)
        finally:
            os.close(root)

    def makedirs(self, relative: str) -> None:
        """Make the directories of `relative` that are missing, each in its parent opened
        beneath the workspace (made first if it is missing: a path of the spec's)."""
        self.root.mkdir(parents=True, exist_ok=True)
        parts = Path(relative).parts
        for depth in range(len(parts)):
            parent = self.open(os.path.join(".", *parts[:depth]), os.O_PATH | os.O_DIRECTORY)
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(parts[depth], dir_fd=parent)
            finally:
                os.close(parent)

    def _beneath(self, root: int, relative: str, flags: int, mode: int) -> int:
        resolve = _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS
        how = _OpenHow(flags, mode if flags & os.O_CREAT else 0, resolve)
        path = os.fsencode(relative)
        try:
            return syscall(_OPENAT2, root, path, ctypes.byref(how), ctypes.sizeof(how), what="open")
        except OSError as error:
            if error.errno == errno.EXDEV:
                raise ToolError(f"{relative!r} is outside the workspace") from None
            if error.errno == errno.ELOOP:
                raise ToolError(f"{relative!r}: a symlink loop, or a link of /proc") from None
            if error.errno not in (errno.ENOSYS, errno.EPERM):
                raise OSError(error.errno, os.strerror(error.errno or 0), relative) from None
        # No openat2: the parent directory, checked through its descriptor, then the name in
        # it without following a symlink (nor `..`, which would leave the checked directory).
        if ".." in Path(relative).parts:
            raise ToolError(f"{relative!r} goes through `..` (taken with openat2 only)")
        head, name = os.path.split(relative)
        parent = os.open(head or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root)
        try:
            if not self._inside(Path(os.readlink(f"/proc/self/fd/{parent}"))):
                raise ToolError(f"{relative!r} is outside the workspace")
            try:
                return os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=parent)
            except OSError as error:  # ELOOP, or ENOTDIR with O_DIRECTORY: a symlink?
                if error.errno not in (errno.ELOOP, errno.ENOTDIR) or not os.path.islink(
                    os.path.join(f"/proc/self/fd/{parent}", name)
                ):
                    raise
                raise ToolError(f"{relative!r} is a symlink (followed with openat2 only)") from None
        finally:
            os.close(parent)


@contextlib.contextmanager
def plainly(path: str) -> Iterator[None]:
    """What the system said of `path` as a tool error naming the path the model gave (never
    the workspace's own)."""
    try:
        yield
    except FileNotFoundError:
        raise ToolError(f"no such file: {path}") from None
    except OSError as error:
        raise ToolError(f"{path!r}: {os.strerror(error.errno or 0)}") from None
    except RuntimeError:  # `Path.resolve` on a symlink loop (it names the absolute path)
        raise ToolError(f"{path!r}: a symlink loop") from None
    except ValueError as error:  # a NUL byte, a lone surrogate
        raise ToolError(f"{path!r} is not a path: {str(error)[:100]}") from None


def _regular(fd: int, path: str) -> int:
    """`fd` if it is a regular file's, else closed and refused (a directory, a FIFO, a
    device, a socket)."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ToolError(f"{path!r} is not a regular file")
    return fd


def read_file_tool(workspace: Workspace, name: str = "read_file") -> ToolDef:
    @tool(name=name, replay="safe", concurrency_safe=True)
    async def read_file(path: RelativePath) -> str:
        """Read a text file from the workspace."""
        return _read(workspace, path).decode(errors="replace")

    return read_file


def _read(workspace: Workspace, path: str) -> bytes:
    with plainly(path):
        fd = workspace.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO does not block
        with open(_regular(fd, path), "rb") as file:
            return file.read(MAX_READ_BYTES)


def _write(workspace: Workspace, path: str, content: str, flags: int) -> None:
    workspace.check(path)  # refused by the path the model gave, not by a part of it
    with plainly(path):
        workspace.makedirs(str(Path(path).parent))
        fd = workspace.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | flags)
        with open(_regular(fd, path), "w") as file:
            file.write(content)


def write_file_tool(workspace: Workspace, name: str = "write_file") -> ToolDef:
    @tool(name=name)
    async def write_file(path: RelativePath, content: str) -> str:
        """Create or replace a text file in the workspace."""
        _write(workspace, path, content, os.O_TRUNC)
        return f"wrote {len(content.encode())} bytes to {path}"

    return write_file


def append_file_tool(workspace: Workspace, name: str = "append_file") -> ToolDef:
    @tool(name=name)
    async def append_file(path: RelativePath, content: str) -> str:
        """Append text to a file in the workspace (created if missing)."""
        _write(workspace, path, content, os.O_APPEND)
        return f"appended {len(content.encode())} bytes to {path}"

    return append_file


def list_files_tool(workspace: Workspace, name: str = "list_files") -> ToolDef:
    @tool(name=name, replay="safe", concurrency_safe=True)
    async def list_files(path: RelativePath = ".") -> str:
        """List the files under a workspace directory (hidden files and folders left out)."""
        return "\n".join(_listed(workspace, path)) or "(empty)"

    return list_files


def _is_file(name: str, directory: int) -> bool:
    with contextlib.suppress(OSError):
        return stat.S_ISREG(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
    return False


def _listed(workspace: Workspace, path: str) -> list[str]:
    """The regular files under `path`, walked from a descriptor opened beneath the workspace, never
    through a symlink (one swapped in for a directory mid-walk included)."""
    with plainly(path):
        try:
            fd = workspace.open(path, os.O_PATH | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            raise ToolError(f"no such directory: {path}") from None
    try:
        with plainly(path):
            where = Path(os.readlink(f"/proc/self/fd/{fd}")).relative_to(workspace.root)
            found = []
            for top, dirs, files, top_fd in os.fwalk(".", dir_fd=fd):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                found += [
                    os.path.normpath(where / top / f)
                    for f in files
                    if not f.startswith(".") and _is_file(f, top_fd)
                ]
            return sorted(found)
    finally:
        os.close(fd)
