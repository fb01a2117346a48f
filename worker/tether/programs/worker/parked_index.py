"""The index of an agent's parked calls: what its sidecars list, and where they answer them.

A virtual object `<agent>-parked` with one key (`tether.parked.INDEX_KEY`): each call that parks
is added under its awakeable id by a journaled one-way send from the run (so exactly once), and
removed when the run takes its answer. Its handlers open to the ingress need the webhook secret,
which no tool can read, though the tools reach the ingress from the sidecar's own network:

- `calls` lists the records for a listing token (`tether.programs.webhooks.listing_token`). An
  awakeable id answers its call through Restate's own API, so only the secret's holders may learn
  one; and with this, the agents' pods need no access to Restate's admin API (which reads and kills
  every agent's runs).
- `answer` resolves or rejects a call it holds, for a proof made with the secret
  (`tether.programs.webhooks.answer_proof`). The sidecar sends it with the call's idempotency key
  (`tether-answer:<awakeable id>`), so the first answer through any replica is the only one that
  acts. Restate takes the send even while the worker is down; the answer acts when it is back.
- `claim` takes a delivery id (a Standard Webhooks `webhook-id`) as soon as its signature
  verifies. The sidecar sends it under an idempotency key made from the id, so Restate's record
  of that key is the claim, through every replica and restart; the handler returns what it was
  sent, an HMAC of the call and verb (`delivery_claim`), which a sidecar checks when the
  delivery comes again (a sender's retry goes on for that call only) and which names no call to
  whoever reads it. (A proof would change nothing: Restate records the key of a send before the
  handler runs, and a tool that burns a delivery id it somehow knew only makes its sender retry
  with a new one.)
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import restate
from restate.exceptions import TerminalError

from ...parked import INDEX_KEY, ParkedCall
from ...spec import restate_services
from ..webhooks import (
    SignatureError,
    verified_by_any,
    verify_answer_proof,
    verify_listing_token,
)
from .retries import RETRY_AFTER_WORKER_LOSS
from .untrusted import parsed

ANSWER_IDEMPOTENCY_RETENTION = timedelta(days=7)
"""How long Restate keeps the key of an answer after it ran: once the run took the answer the
call is no longer indexed and any other answer to it is refused anyway, so this only has to
outlast a worker outage between the answer and the run taking it."""
DELIVERY_IDEMPOTENCY_RETENTION = timedelta(days=1)
"""How long a claimed delivery id is kept: far longer than the 10 minutes a signature is
accepted (`tether.programs.webhooks.TOLERANCE_SECONDS` either side of its timestamp)."""


def _refused(error: SignatureError) -> TerminalError:
    return TerminalError(f"refused: {error}", status_code=401)


class ParkedIndex:
    """The object, and the sends that keep it (`add`/`remove` from a run's context)."""

    def __init__(self, agent: str, secrets: Sequence[bytes]) -> None:
        """`secrets`: the webhook keys accepted (the current one; the previous one too during a
        rotation); none refuses every read and answer."""
        self.object = restate.VirtualObject(
            restate_services(agent).parked,
            description=f"The parked calls of the {agent} agent, for its sidecars (signed).",
            invocation_retry_policy=RETRY_AFTER_WORKER_LOSS,
        )

        def check(verify: Any, *args: Any) -> None:
            def verified() -> None:
                try:
                    verified_by_any(secrets, verify, *args)
                except SignatureError as error:
                    raise _refused(error) from None

            parsed("a signed request", verified)  # anything else its input made it raise: 400

        # One key holds every parked call of the agent. Only `calls` reads them all: the other
        # handlers load state lazily, or each of them would receive the whole index (with 1,000
        # calls parked, Restate spent 1.75 ms of CPU per answer, 0.63 ms lazily).
        @self.object.handler(ingress_private=True, enable_lazy_state=True)
        async def add(ctx: restate.ObjectContext, record: dict[str, Any]) -> None:
            ctx.set(record["awakeable_id"], record)

        @self.object.handler(ingress_private=True, enable_lazy_state=True)
        async def remove(ctx: restate.ObjectContext, awakeable_id: str) -> None:
            ctx.clear(awakeable_id)

        @self.object.handler(kind="shared")
        async def calls(ctx: restate.ObjectSharedContext, token: Any) -> list[dict[str, Any]]:
            """Every parked call, for a listing token."""
            check(verify_listing_token, token)
            records: list[dict[str, Any] | None] = [
                await ctx.get(key, type_hint=dict) for key in await ctx.state_keys()
            ]
            return [record for record in records if record]

        @self.object.handler(
            kind="shared",
            idempotency_retention=ANSWER_IDEMPOTENCY_RETENTION,
            enable_lazy_state=True,
        )
        async def answer(ctx: restate.ObjectSharedContext, request: Any) -> dict[str, bool]:
            """`{"awakeable_id", "value" | "reject", "proof"}`: resolve (or reject) a call this
            index holds; `{"answered": false}` for one it does not (answered, or not parked)."""
            if not isinstance(request, dict) or not isinstance(request.get("awakeable_id"), str):
                raise TerminalError("expected {awakeable_id, value | reject, proof}", 400)
            awakeable_id: str = request["awakeable_id"]
            given: dict[str, Any] = {k: request[k] for k in ("value", "reject") if k in request}
            check(verify_answer_proof, awakeable_id, given, str(request.get("proof", "")))
            if await ctx.get(awakeable_id, type_hint=dict) is None:
                return {"answered": False}
            reason = given.get("reject")
            if isinstance(reason, str):
                ctx.reject_awakeable(awakeable_id, reason)
            else:
                ctx.resolve_awakeable(awakeable_id, given.get("value"))
            return {"answered": True}

        @self.object.handler(
            kind="shared",
            idempotency_retention=DELIVERY_IDEMPOTENCY_RETENTION,
            enable_lazy_state=True,
        )
        async def claim(ctx: restate.ObjectSharedContext, delivery: Any) -> Any:
            """A delivery id taken by a sidecar: the send's idempotency key is the record, and
            its output, an HMAC of the call and verb (`delivery_claim`), where a sender may
            retry the delivery."""
            return delivery

        self._add, self._remove = add, remove

    def add(self, ctx: restate.ObjectContext, record: ParkedCall) -> None:
        ctx.object_send(self._add, key=INDEX_KEY, arg=dict(record))

    def remove(self, ctx: restate.ObjectContext, awakeable_id: str) -> None:
        ctx.object_send(self._remove, key=INDEX_KEY, arg=awakeable_id)
