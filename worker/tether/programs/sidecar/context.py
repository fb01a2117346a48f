"""`Sidecar`: what the request handlers share (settings, the Restate client, the parked-call
reader, the sessions its clients stream, the replay guard and the resolution ledger), kept on
`app.state.sidecar`, and the one way to answer a parked call with them.

An answer acts at most once through any number of replicas and restarts: it is a send to the
`answer` handler of the agent's index (`tether.programs.worker.parked_index`) under the idempotency
key `tether-answer:<awakeable id>`, so the first answer (resolve or reject, webhook or link,
whichever replica) is the one Restate runs and every later one gets `PreviouslyAccepted`: 409,
already answered. The replay guard and the ledger are per-process caches in front of that: they
spare Restate a call, never decide alone.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import Depends
from starlette.requests import Request

from ..webhooks import answer_proof, delivery_claim, signed_by_any
from .auth import ReplayGuard
from .ledger import ResolutionLedger
from .parked_calls import ParkedCalls
from .rejection import Rejection
from .restate_client import ACCEPTED, RestateClient
from .settings import SidecarSettings
from .watching import Watching

log = logging.getLogger("tether.programs.sidecar")
T = TypeVar("T")
ANSWER_KEY_PREFIX = "tether-answer:"


DELIVERY_KEY_PREFIX = "tether-delivery-"


def delivery_key(delivery: str) -> str:
    """The idempotency key that claims a delivery id (a Standard Webhooks `webhook-id`) at the
    agent's index: a hash, so no sender's id reaches Restate as it is."""
    return DELIVERY_KEY_PREFIX + hashlib.sha256(delivery.encode()).hexdigest()[:32]


def answer_key(awakeable_id: str) -> str:
    """The idempotency key of every answer to the call parked on `awakeable_id`: one per call,
    so whatever answers it first (resolve or reject, a webhook or a link) is the only one."""
    return ANSWER_KEY_PREFIX + awakeable_id


@dataclass
class Sidecar:
    settings: SidecarSettings
    restate: RestateClient
    parked: ParkedCalls
    watching: Watching
    replay_guard: ReplayGuard = field(default_factory=ReplayGuard)
    ledger: ResolutionLedger = field(default_factory=ResolutionLedger)

    async def answer(
        self,
        awakeable_id: str,
        how: str,
        answer: dict[str, Any],
        *,
        approver: str | None = None,
    ) -> None:
        """Answer a parked call once: `answer` is `{"value": ...}` (resolve) or `{"reject":
        "<reason>"}`. Ledger claim (this process); a call the agent's index does not hold is
        refused (404), unless the index cannot be read (its worker is down): Restate takes the
        answer then, and it acts if the call is parked when the worker is back. Then the
        idempotent, proven send to the index's `answer` handler; 409 if any answer reached
        Restate before, through any replica. If the send fails the call stays answerable. The
        log line names the approver, if known (an audit trail next to the value Restate keeps)."""
        self.ledger.claim(awakeable_id)
        try:
            try:
                await self.parked.require(awakeable_id)
            except Rejection as error:
                if error.status != 503:
                    raise
                log.warning("the parked calls cannot be read; answering %s anyway", awakeable_id)
            proof = answer_proof(self.settings.secret, awakeable_id, answer)
            payload = orjson.dumps({"awakeable_id": awakeable_id, **answer, "proof": proof})
            sent = await self.restate.send_answer(
                self.settings.agent, payload, answer_key(awakeable_id)
            )
        except BaseException:
            self.ledger.release(awakeable_id)
            raise
        self.parked.forget(awakeable_id)
        if sent.get("status") != ACCEPTED:
            self.ledger.done(awakeable_id, "by an earlier request")
            raise Rejection(409, "already_resolved", "this call was already answered")
        self.ledger.done(awakeable_id, how)
        if approver is None:
            log.info("awakeable %s %s", awakeable_id, how)
        else:
            log.info("awakeable %s %s (approver %r)", awakeable_id, how, approver)

    async def claim_delivery(self, delivery: str, awakeable_id: str, verb: str) -> None:
        """Take a delivery id for one call and verb through every replica and restart: a send
        to the index's `claim` under `delivery_key(delivery)`, kept a day, whose output is
        `delivery_claim` of them (an HMAC: the output names no call to whoever reads it). Taken
        as soon as its signature verifies, before anything can refuse it: sent again, as a
        sender retries it, it goes on only for what it was first taken for (whose answer acts
        once under the call's own key), and is 409 `replayed` for anything else."""
        secret = self.settings.secret
        claim = {"mac": delivery_claim(secret, awakeable_id, verb)}
        sent = await self.restate.send_claim(self.settings.agent, delivery_key(delivery), claim)
        if sent.get("status") == ACCEPTED:
            return
        first = await self.restate.output(str(sent.get("invocationId")))
        mac = first.get("mac") if isinstance(first, dict) else None
        if not signed_by_any(
            self.settings.secrets, mac, lambda s: delivery_claim(s, awakeable_id, verb)
        ):  # another call's or verb's, or a claim of a version that kept none
            raise Rejection(409, "replayed", "this webhook-id was already received")

    async def once(self, signature: str, timestamp: int, act: Callable[[], Awaitable[T]]) -> T:
        """`act()` for a signed request, unless this process saw its signature (409: the replay
        guard, a first line only; `act` itself must be idempotent in Restate). If `act` fails,
        the signature is forgotten here so that the sender may retry it."""
        self.replay_guard.claim(signature, timestamp)
        try:
            return await act()
        except BaseException:
            self.replay_guard.release(signature)
            raise


async def sidecar_of(request: Request) -> Sidecar:
    sidecar: Sidecar = request.app.state.sidecar
    return sidecar


SidecarDep = Annotated[Sidecar, Depends(sidecar_of)]
"""The shared state, as a FastAPI dependency."""
