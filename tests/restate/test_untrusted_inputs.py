"""What anything that reaches Restate's ingress (the agent's own tools among them) may send to
the agent's signed objects: a body that breaks their parsing in a way no schema names (a number
past a float's range, a time zone too long for a file name) is refused at once with a 400, and
the object's key is not left locked behind an invocation that Restate retries. A real
restate-server and `tether worker`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.restate.support import http, worker_process
from tests.restate.test_worker import manifest
from tether.budget import Spend
from tether.programs.restate_server import RestateServer
from tether.programs.webhooks import (
    pace_signature,
    schedule_order,
    spend_signature,
    watch_request,
    watch_tag,
)
from tether.programs.worker.inbox import MAX_WAITING
from tether.programs.worker.pace import pace_ask
from tether.programs.worker.spend import spend_request
from tether.programs.worker.watchers import MAX_WATCHED, TAGS_PER_WATCH
from tether.rate import Pace, Rate
from tether.spend_caps import SpendCap
from tether.testing import HypercornWorker

AGENT = "guarded"
SECRET = b"s3cret"
HUGE = "1" + "0" * 400  # an integer no float holds
SCHEDULE = {"name": "daily", "cron": "0 9 * * *", "timeZone": "UTC", "prompt": "go"}


@pytest.fixture
def worker(restate_server: RestateServer, tmp_path: Path) -> Iterator[HypercornWorker]:
    document = manifest(AGENT, [{"text": "ok"}], webhook={"secretRef": {"name": "h", "key": "k"}})
    process = worker_process(
        restate_server, tmp_path, document, TETHER_WEBHOOK_SECRET=SECRET.decode()
    )
    with process as served:
        restate_server.register(served.url)
        yield served


def raw_post(server: RestateServer, path: str, body: str) -> int:
    """POST `body` as it is (JSON Python would not write), answered within 10 s."""
    url = f"{server.ingress_url}/{AGENT}-{path}"
    return http("POST", url, raw=body.encode(), timeout=10).status


def post(server: RestateServer, path: str, body: dict[str, Any]) -> Any:
    return http("POST", f"{server.ingress_url}/{AGENT}-{path}", body, timeout=10)


def test_a_body_that_breaks_the_parsing_is_refused_and_locks_nothing(
    restate_server: RestateServer, worker: HypercornWorker
) -> None:
    long_zone = {**SCHEDULE, "timeZone": "Europe/" + "x" * 5000}
    poisoned = {
        "schedule/daily/set": [
            '{"sig": "x", "owner": "o", "generation": 1e999, "stamp": 1, "schedule": null}',
            f'{{"sig": "x", "owner": "o", "generation": 1, "stamp": {HUGE}, "schedule": null}}',
            json.dumps(
                {"sig": "x", "owner": "o", "generation": 1, "stamp": 1, "schedule": long_zone}
            ),
        ],
        "schedule/daily/run_now": [
            f'{{"sig": "x", "request": "r", "owner": "o", "stamp": {HUGE}}}',
        ],
        "spend/all/reserve": [
            '{"op": "reserve", "hold": "h", "sig": "x", "caps": [], "stamp": 1, '
            '"amount": {"tokens": 1e999}}',
            '{"op": "reserve", "hold": "h", "sig": "x", "caps": [{"per": "day", '
            f'"tokens": 1e999}}], "stamp": {HUGE}, "amount": {{}}}}',
        ],
        "pace/scripted%2Fs/admit": [
            '{"sig": "x", "perMinute": 60, "burst": 1, "tokensPerMinute": null, '
            '"tokens": 1e999, "stamp": 1}',
        ],
    }
    for path, bodies in poisoned.items():
        for body in bodies:
            assert raw_post(restate_server, path, body) == 400, (path, body)

    # Each object answers a signed request at once: no invocation of its key is left retrying.
    order = schedule_order(SECRET, "daily", SCHEDULE, owner="o", generation=1, stamp=time.time())
    assert post(restate_server, "schedule/daily/set", order).status == 200
    caps = [SpendCap.of({"per": "day", "tokens": 1_000})]
    reserve = spend_request("reserve", "h1", Spend(0, 10), caps, time.time())
    reserve["sig"] = spend_signature(SECRET, reserve)
    assert post(restate_server, "spend/all/reserve", reserve).json() == {"granted": True}
    ask = pace_ask(Pace(requests=Rate(60, 1)), 10, time.time())
    ask["sig"] = pace_signature(SECRET, "scripted/s", ask)
    assert post(restate_server, "pace/scripted%2Fs/admit", ask).status == 200


def test_what_a_tool_may_send_a_session_is_refused_before_it_can_wedge_the_session(
    restate_server: RestateServer, worker: HypercornWorker
) -> None:
    """A message no run could store (a lone surrogate), a run of a new session without a
    prompt, and more messages than a run takes are refused at once; the session's runs go on."""
    ingress = restate_server.ingress_url
    lone = '{"text": "hi \\ud800"}'  # valid JSON, not valid Unicode
    assert (
        http("POST", f"{ingress}/{AGENT}-inbox/s1/post", raw=lone.encode(), timeout=10).status
        == 400
    )
    assert http("POST", f"{ingress}/{AGENT}/s1/run", {}, timeout=10).status == 400
    ran = http("POST", f"{ingress}/{AGENT}/s1/run", {"prompt": "go"}, timeout=30)
    assert ran.status == 200 and ran.json()["status"] == "completed", ran.text
    for _ in range(MAX_WAITING):
        assert http("POST", f"{ingress}/{AGENT}-inbox/s2/post", {"text": "hi"}).status == 200
    assert http("POST", f"{ingress}/{AGENT}-inbox/s2/post", {"text": "hi"}).status == 429
    # Reads and pushes of any shape answer at once (the shared ones too: no retried invocation).
    assert http("POST", f"{ingress}/{AGENT}/s1/events", 5, timeout=10).status == 200
    assert raw_post(restate_server, "live/s1/push", "[]") == 200
    assert raw_post(restate_server, "live/s1/read", "[1]") == 200
    answer = '{"awakeable_id": "\\ud800", "value": 1, "proof": "x"}'
    assert raw_post(restate_server, "parked/all/answer", answer) == 400


def test_only_a_sidecar_registers_the_sessions_clients_stream(
    restate_server: RestateServer, worker: HypercornWorker
) -> None:
    """A tool that floods the watched set with tags of its own (the set keeps the latest
    10,000) would push out the real ones, and the workers would drop those sessions' live
    events: a registration must be signed, fresh, and by this agent's secret."""
    real = watch_tag(SECRET, "streamed")
    now_ms = round(time.time() * 1000)
    assert (
        post(restate_server, "watchers/all/watch", watch_request(SECRET, [real], now_ms)).status
        == 200
    )

    flood = [f"{n:032x}" for n in range(TAGS_PER_WATCH)]
    for forged in (
        flood,  # the unsigned list of tags of a sidecar before
        {"tags": flood, "stamp": now_ms, "sig": "0" * 64},
        watch_request(b"another agent's secret", flood, now_ms),
        watch_request(SECRET, flood, now_ms - 3_600_000),  # a registration seen an hour ago
    ):
        for _ in range(MAX_WATCHED // TAGS_PER_WATCH + 1):
            assert post(restate_server, "watchers/all/watch", forged).status in (400, 401)
    raw = '{"tags": [], "stamp": 1e999, "sig": "x"}'
    assert raw_post(restate_server, "watchers/all/watch", raw) == 400
    kept = post(restate_server, "watchers/all/watched", [real, *flood[:3]]).json()
    assert list(kept) == [real], kept
