"""A worker's end of `<agent>-spend` (`spend`): its model calls hold their worst case there
before they are sent, and settle what they spent. A hold that Restate does not grant or answer
keeps the call from starting: a call the caps cannot count is not sent (the loop retries it with
its backoff, as a 429)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import httpx2

from ...budget import Spend
from ...providers import ProviderError
from ...spec import SPEND_KEY, restate_services
from ...spend_caps import Refusal, SpendCap
from ..webhooks import spend_signature
from .ingress import IngressPoster, answer_of
from .spend import spend_request

log = logging.getLogger(__name__)


class RestateSpendGate:
    """A worker's `tether.providers.SpendGate`, over `<agent>-spend/all`."""

    def __init__(
        self, agent: str, caps: Sequence[SpendCap], ingress: IngressPoster, secret: bytes
    ) -> None:
        self.caps = tuple(caps)
        self.ingress = ingress
        self.secret = secret
        self._path = f"/{restate_services(agent).spend}/{SPEND_KEY}"

    async def reserve(self, hold: str, ask: Spend, model: str) -> Refusal | None:
        response = await self._send("reserve", hold, ask, model)
        if response is not None and response.status_code == 200:
            try:
                answer = response.json()
                return None if answer.get("granted") else Refusal.of(answer["refusal"])
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
        # Restate may have made the hold without its answer coming back: give it back (a reserve
        # still on its way then holds nothing), or the call, retried under a hold of its own,
        # would be held twice, and the lost hold counted as spent once it lapses.
        await self.settle(hold, Spend())
        raise ProviderError(
            f"the agent's spend caps could not hold the call ({answer_of(response)} from "
            "Restate): it is "
            "not sent until they can",
            provider="spend caps",
            code="spend_unheld",
            retryable=True,
        )

    async def settle(self, hold: str, actual: Spend) -> None:
        response = await self._send("settle", hold, actual)
        if response is None or response.status_code != 200:
            log.warning(
                "the spend caps: settling a call gave %s; what it spent (%s) is not counted, "
                "and its hold counts as spent, at its worst case, once it lapses",
                answer_of(response),
                actual.to_json(),
            )

    async def _send(
        self, op: str, hold: str, amount: Spend, model: str = ""
    ) -> httpx2.Response | None:
        request = spend_request(op, hold, amount, self.caps, round(time.time(), 3), model)
        request["sig"] = spend_signature(self.secret, request)
        return await self.ingress.post(f"{self._path}/{op}", request, f"the spend caps ({op})")
