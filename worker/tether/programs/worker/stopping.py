"""Whether the serving process is stopping: SIGTERM (a scale-down, a node drain, a deleted pod).

Hypercorn then stops taking connections and new streams, and marks its worker context
terminated; the runs in flight may go on for its graceful timeout. Our HTTP/2 protocol
(`connection_age.RetiringH2Protocol`, one per connection) hands that event here, and each run's
runtime reads it before its next model step (`RestateRuntimeOptions.stopping`): the run leaves
at its turn's boundary, and Restate resumes it on another replica at once.

Hypercorn's serving process closes its listening socket then, but its parent keeps its own copy
open until the end: a connection made meanwhile (a Service's endpoints change a moment after a
pod starts terminating) is queued and never answered, and Restate gives such an attempt up only
after about 10 s. So the socket itself is shut down here too (through a copy of its descriptor
kept from the start), and such a connection is refused at once, as a stopped pod's port refuses
it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

from hypercorn.typing import Event

_terminated: Event | None = None
"""Hypercorn's `WorkerContext.terminated` (one per serving process), once a connection came."""
_refusing: asyncio.Task[None] | None = None


def watch(terminated: Event, bind: str) -> None:
    """Called at each connection; the first one's event is the process's, and once it is set
    the listening socket of `bind` (`host:port`) is shut down."""
    global _terminated, _refusing
    if _terminated is None:
        _terminated = terminated
        port = bind.rpartition(":")[2]
        listening = listening_sockets(int(port)) if port.isdigit() else []
        _refusing = asyncio.get_running_loop().create_task(_refuse(terminated, listening))


def is_stopping() -> bool:
    return _terminated is not None and _terminated.is_set()


async def _refuse(terminated: Event, listening: list[socket.socket]) -> None:
    await terminated.wait()
    for sock in listening:
        with contextlib.suppress(OSError), sock:
            sock.shutdown(socket.SHUT_RDWR)


def listening_sockets(port: int) -> list[socket.socket]:
    """Copies of this process's listening sockets on `port` (Linux `/proc`; elsewhere none)."""
    found = []
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return []
    for fd in descriptors:
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:  # the listing's own descriptor, gone by now
            continue
        try:
            wanted = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
            wanted = wanted and sock.getsockname()[1] == port
        except OSError:
            wanted = False
        if wanted:
            found.append(sock)
        else:
            sock.close()
    return found
