"""A worker's end of `<agent>-pace` (`pace`): its calls of a model with a rate limit take their
slots there. When Restate does not answer, a call is paced in its process alone (logged): a
slower pace is better than a call that waits for Restate."""

from __future__ import annotations

import logging
import time
from urllib.parse import quote

from ...providers.pace import LocalPacer
from ...rate import Pace
from ...spec import restate_services
from ..webhooks import pace_signature
from .ingress import IngressPoster, answer_of
from .pace import pace_ask

log = logging.getLogger(__name__)


class RestatePacer:
    """A worker's `tether.providers.Pacer` of one model, over `<agent>-pace/<model>`."""

    def __init__(
        self, agent: str, model: str, pace: Pace, ingress: IngressPoster, secret: bytes
    ) -> None:
        self.model = model
        self.pace = pace
        self.ingress = ingress
        self.secret = secret
        self._path = f"/{restate_services(agent).pace}/{quote(model, safe='')}/admit"
        self._alone = LocalPacer(pace)

    async def admit(self, tokens: int) -> float:
        ask = pace_ask(self.pace, tokens, round(time.time(), 3))
        ask["sig"] = pace_signature(self.secret, self.model, ask)
        response = await self.ingress.post(self._path, ask, f"the pace of {self.model}")
        if response is not None and response.status_code == 200:
            try:
                return float(response.json()) / 1000
            except ValueError:
                pass
        log.warning(
            "the pace of %s: Restate gave %s; paced in this process",
            self.model,
            answer_of(response),
        )
        return await self._alone.admit(tokens)
