"""What a model's `rateLimit` buys against a provider that enforces one.

    .venv/bin/python bench/rate_limited.py [--runs 20] [--rpm 60] [--burst 5]

`--runs` runs of three model calls each start at once, in process, through the real Anthropic SDK
client, against the fake model server made to let `--rpm` calls a minute through, `--burst` at
once (a token bucket, as the providers keep), and answer the rest 429 with a `retry-after`. Once
without a pace (the loop retries a 429 four times with journaled backoff, then the run ends with
status error), once paced at the provider's rate (`Limited` with a `LocalPacer`). Not a timing:
the floor is the provider's own limit, the least time its bucket lets the calls through in, and
the count of 429s.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: the repository's fakes, as `tests`

from tests.fakes.model_server import ErrorReply, ModelServer, Reply, ToolCall  # noqa: E402
from tether import create_agent, tool  # noqa: E402
from tether.providers import Limited, LocalPacer, Pace, Rate, anthropic  # noqa: E402


class Bucketed(ModelServer):
    """The fake model server behind a token bucket: two tool turns, then an answer."""

    def __init__(self, rpm: int, burst: int) -> None:
        super().__init__()
        self.rpm, self.burst = rpm, burst
        self.tokens, self.at = float(burst), time.monotonic()
        self.refused = 0
        self._bucket = threading.Lock()

    def _take(self, request: Any) -> Any:
        with self._bucket:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rpm / 60)
            self.at = now
            refused = self.tokens < 1
            if refused:
                self.refused += 1
                wait = (1 - self.tokens) * 60 / self.rpm
            else:
                self.tokens -= 1
        self.requests.append(request)
        if refused:
            return ErrorReply(429, "rate limited", "rate_limit_error", retry_after=f"{wait:.2f}")
        turns = sum(1 for m in request.body["messages"] if m["role"] == "assistant")
        return Reply(tool_calls=[ToolCall("noop", {})]) if turns < 2 else Reply(text=["done"])


@tool(replay="safe")
async def noop() -> str:
    """Does nothing."""
    return "ok"


async def measure(runs: int, rpm: int, burst: int, paced: bool) -> str:
    with Bucketed(rpm, burst) as server:
        model = anthropic("claude-test", api_key="k", base_url=server.anthropic_url)
        if paced:
            model = Limited(model, pacer=LocalPacer(Pace(Rate(rpm, burst))))
        started = time.monotonic()
        agents = [create_agent(provider=model, tools=[noop]) for _ in range(runs)]
        stats = await asyncio.gather(*(agent.run("go") for agent in agents))
        took = time.monotonic() - started
    ended = dict(collections.Counter(s.status for s in stats))
    floor = max(0, runs * 3 - burst) * 60 / rpm
    return (
        f"{'paced' if paced else 'unpaced'}: {runs} runs {ended} in {took:.1f} s "
        f"(the provider's floor {floor:.0f} s), {len(server.requests)} requests, "
        f"{server.refused} answered 429"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rpm", type=int, default=60)
    parser.add_argument("--burst", type=int, default=5)
    args = parser.parse_args()
    for paced in (False, True):
        print(asyncio.run(measure(args.runs, args.rpm, args.burst, paced)))


if __name__ == "__main__":
    main()
