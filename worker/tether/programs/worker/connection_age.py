"""HTTP/2 connections that retire with age, so that every pod behind a worker Service gets runs.

Restate multiplexes invocations over a few long-lived HTTP/2 connections to a deployment's URL,
and puts the next invocation on a connection that has a free stream; it opens another only when
they are nearly full. A Service (kube-proxy) balances connections, not requests. So a pod that
joins a Service under steady load, added by a scale-out or back from a restart, would get no
invocation until the load grew: it joined, and did nothing.

Here a connection older than `connection_max_age` (the hypercorn config's, seconds, each
connection's drawn within +-10% so they do not all go together) takes no new streams: the worker
advertises `SETTINGS_MAX_CONCURRENT_STREAMS` 0 on it, as hypercorn does when it shuts down, and
Restate opens a new connection for its next invocations, which the Service routes afresh. The old
one is closed (GOAWAY) once its in-flight invocations end: none is cut off. gRPC servers do the
same (`MAX_CONNECTION_AGE`) behind L4 balancers.

Hypercorn has no setting for it, so `install` puts `RetiringH2Protocol` in place of its HTTP/2
protocol (`hypercorn.protocol.H2Protocol`, which hypercorn looks up per connection), in the
process that serves.
"""

from __future__ import annotations

import random
import time
from typing import Any

import h2.events
import h2.settings
import hypercorn.protocol
from hypercorn.protocol.events import Event, StreamClosed
from hypercorn.protocol.h2 import H2Protocol

from . import stopping

JITTER = 0.1


class RetiringH2Protocol(H2Protocol):
    """Hypercorn's HTTP/2 protocol, with a connection that retires at its age (module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        stopping.watch(self.context.terminated, self.config.bind[0])
        max_age: float | None = getattr(self.config, "connection_max_age", None)
        self._retires_at = (
            time.monotonic() + max_age * random.uniform(1 - JITTER, 1 + JITTER) if max_age else None
        )
        self._retiring = False

    async def _handle_events(self, events: list[Any]) -> None:
        if self.context.terminated.is_set():
            events = self._without_refused_bodies(events)
        await super()._handle_events(events)
        # Checked as frames arrive: a connection that carries nothing needs no retiring.
        if self._retires_at is not None and time.monotonic() >= self._retires_at:
            self._retires_at = None
            self._retiring = True
            self.connection.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 0})
            await self._flush()
            await self._close_when_done()

    def _without_refused_bodies(self, events: list[Any]) -> list[Any]:
        """Once the worker stops, hypercorn refuses each new request (a stream reset), but the
        request's body may come in the same read; hypercorn then looks for its stream, fails
        (KeyError), and the connection's task group cancels every invocation in flight on it,
        the ones the graceful timeout is for. Such a body is acknowledged and dropped here."""
        kept = []
        for event in events:
            if isinstance(event, h2.events.DataReceived) and event.stream_id not in self.streams:
                self.connection.acknowledge_received_data(
                    event.flow_controlled_length, event.stream_id
                )
                continue
            kept.append(event)
        return kept

    async def stream_send(self, event: Event) -> None:
        await super().stream_send(event)
        if isinstance(event, StreamClosed):
            await self._close_when_done()

    async def _send_data(self, stream_id: int) -> None:
        await super()._send_data(stream_id)
        await self._close_when_done()

    async def _close_when_done(self) -> None:
        # Done: no stream open, and every response sent to its end. A stream leaves `streams`
        # when its app returns, before the sending task has sent what it left in its buffer;
        # closed then, Restate would wait for the rest of the response and give up after 5 s.
        # At shutdown hypercorn closes its idle connections itself.
        if (
            self._retiring
            and not self.streams
            and not self.stream_buffers
            and not self.context.terminated.is_set()
        ):
            self._retiring = False
            self.connection.close_connection()
            await self._flush()


def install() -> None:
    """Serve HTTP/2 connections with `RetiringH2Protocol` in this process."""
    hypercorn.protocol.H2Protocol = RetiringH2Protocol  # type: ignore[attr-defined]
