"""The agent's spend caps (`limits.spendCaps`) on a real restate-server and `tether worker`: all
runs of the agent, on any worker, hold their calls in `<agent>-spend/all`
(`tether.programs.worker.spend`), so a cap holds across replicas and for runs at once; only a
worker's signed, fresh request takes a hold or settles one, and once."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from tests.restate.support import attach, http, send_run, wait_until, worker_process
from tests.restate.test_worker import manifest, model_calls
from tether.budget import Spend
from tether.programs.local_http import Response
from tether.programs.restate_server import RestateServer
from tether.programs.webhooks import spend_signature
from tether.programs.worker.spend import spend_request
from tether.providers.spend import WAKE_SPREAD_SECONDS
from tether.spend_caps import SpendCap
from tether.testing import HypercornWorker

SECRET = b"s3cret"
USED = {"input": 200, "output": 50}
"""What each call uses: 250 tokens."""
CAP = 2_000
CAPS = {"spendCaps": [{"per": "day", "maxTokens": CAP}]}


@contextmanager
def worker(
    server: RestateServer,
    directory: Path,
    agent: str,
    caps: dict[str, Any] = CAPS,
    fallbacks: list[dict[str, Any]] | None = None,
    **extra: str,
) -> Iterator[HypercornWorker]:
    """A `tether worker` of `agent`, whose runs answer at once with a call of 250 tokens (of
    its model `s`, or of its `fallbacks`), registered as the latest deployment."""
    document = manifest(
        agent,
        [{"text": "ok", "usage": USED}],
        webhook={"secretRef": {"name": "hook", "key": "key"}},
        limits=caps,
    )
    document["spec"]["model"]["maxTokens"] = 100
    if fallbacks:
        document["spec"]["model"]["fallbacks"] = fallbacks
    process = worker_process(
        server,
        directory,
        document,
        TETHER_WEBHOOK_SECRET=SECRET.decode(),
        RESTATE_INGRESS_URL=server.ingress_url,
        **extra,
    )
    with process as served:
        server.register(served.url)
        yield served


def run(server: RestateServer, agent: str) -> dict[str, Any]:
    result: dict[str, Any] = attach(
        server.ingress_url, send_run(server.ingress_url, agent, uuid.uuid4().hex, "go"), 60
    )
    return result


def day_spent(server: RestateServer, agent: str) -> dict[str, Any]:
    described = http("POST", f"{server.ingress_url}/{agent}-spend/all/describe").json()
    [day] = [w for w in described["windows"] if w["window"].startswith("day:")]
    return dict(day)


def test_a_cap_holds_across_workers_and_a_refused_run_says_when_it_resets(
    restate_server: RestateServer, tmp_path: Path
) -> None:
    agent = "frugal"
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    with worker(restate_server, tmp_path, agent, PROMETHEUS_MULTIPROC_DIR=str(metrics)):
        results = [run(restate_server, agent)]
        while results[-1]["status"] == "completed" and len(results) < 12:
            results.append(run(restate_server, agent))
        day = day_spent(restate_server, agent)
    completed = len(results) - 1
    refused = results[-1]
    assert refused["status"] == "budget_exceeded", refused.get("error")
    assert "the agent's spend cap of 2,000 tokens a day (UTC) is reached" in refused["error"]
    assert "it resets at " in refused["error"]
    assert completed >= 2 and completed * 250 <= CAP
    assert day["spent"]["tokens"] == completed * 250 and day["held"]["tokens"] == 0
    # The refused call was not made: counted as capped, not as the model's error.
    calls = model_calls(metrics, agent)
    assert (calls[("s", "ok")], calls[("s", "capped")], calls[("s", "error")]) == (completed, 1, 0)
    # Another worker (the first one gone, this one the latest deployment): its count is the
    # agent's, not its own, so its first run is refused too.
    with worker(restate_server, tmp_path, agent):
        assert run(restate_server, agent)["status"] == "budget_exceeded"
        assert day_spent(restate_server, agent) == day


def test_a_run_under_a_cap_that_waits_sleeps_in_restate_until_the_next_period(
    restate_server: RestateServer, tmp_path: Path
) -> None:
    agent = "patient"
    caps = {"spendCaps": [{"per": "day", "maxTokens": CAP, "onReached": "wait"}]}
    if (seconds_left := 86400 - time.time() % 86400) < 120:  # the run must not wake up here
        time.sleep(seconds_left + 1)
    url = restate_server.ingress_url
    with worker(restate_server, tmp_path, agent, caps):
        completed = 0
        while True:
            invocation = send_run(url, agent, f"s{completed}", "go")
            status = wait_until(partial(ended_or_sleeping, restate_server, invocation), timeout=30)
            if status == "completed":
                status = attach(url, invocation, 10)["status"]  # the run's, not Restate's
            if status != "completed":
                break
            completed += 1
        assert status == "suspended" and 2 <= completed <= CAP // 250
        # Its sleep names the cap: the README's query counts it, and not the runs that slept
        # for it before and completed (nor would it a run since asleep for another reason).
        assert restate_server.query(readme_query(agent)) == [{"cap": "day", "runs": 1}]
        events = http("POST", f"{url}/{agent}/s{completed}/events", None).json()
        [waiting] = [e for e in events if e["type"] == "spend_cap_waiting"]
        tomorrow = (time.time() // 86400 + 1) * 86400 * 1000
        assert tomorrow <= waiting["until"] <= tomorrow + WAKE_SPREAD_SECONDS * 1000
        assert "the run waits until it resets at" in waiting["reason"]
        assert day_spent(restate_server, agent)["spent"]["tokens"] == completed * 250
    http("PATCH", f"{restate_server.admin_url}/invocations/{invocation}/kill", None)


def readme_query(agent: str) -> str:
    """The README's query of the runs each cap holds back, for `agent`."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    found = re.search(r'restate sql "(SELECT [^"]*spend-cap:[^"]*)"', readme)
    assert found, "the README's query of the runs a spend cap holds back"
    return found[1].replace("'triage'", f"'{agent}'")


def ended_or_sleeping(server: RestateServer, invocation: str) -> str | None:
    """`completed` for a run that completed, `suspended` for one whose last journal entry is a
    sleep it waits on, None while neither."""
    rows = server.query(
        f"SELECT status, completion_result FROM sys_invocation WHERE id = '{invocation}'"
    )
    if rows and rows[0]["status"] == "completed":
        return "completed" if rows[0]["completion_result"] == "success" else "failed"
    journal = server.query(
        f"SELECT entry_type FROM sys_journal WHERE id = '{invocation}' ORDER BY index"
    )
    sleeping = bool(journal) and journal[-1]["entry_type"] == "Command: Sleep"
    return "suspended" if sleeping and rows and rows[0]["status"] == "suspended" else None


def test_runs_at_once_never_pass_the_cap_together(
    restate_server: RestateServer, tmp_path: Path
) -> None:
    agent = "thrifty"
    with worker(restate_server, tmp_path, agent):
        url = restate_server.ingress_url
        runs = [send_run(url, agent, f"s{n}", "go") for n in range(12)]
        results = [attach(url, invocation, 60) for invocation in runs]
        spent = day_spent(restate_server, agent)["spent"]["tokens"]
    statuses = [result["status"] for result in results]
    assert set(statuses) == {"completed", "budget_exceeded"}, statuses
    assert spent == statuses.count("completed") * 250 <= CAP


def test_only_a_workers_fresh_signed_request_holds_or_settles_once(
    restate_server: RestateServer, tmp_path: Path
) -> None:
    agent = "careful"
    caps = [SpendCap.of({"per": "day", "tokens": CAP})]
    base = f"{restate_server.ingress_url}/{agent}-spend/all"

    def signed(op: str, hold: str, tokens: int, stamp: float | None = None) -> dict[str, Any]:
        when = time.time() if stamp is None else stamp
        body = spend_request(op, hold, Spend(0, tokens), caps, when)
        return {**body, "sig": spend_signature(SECRET, body)}

    def send(op: str, body: dict[str, Any]) -> Response:
        return http("POST", f"{base}/{op}", body)

    with worker(restate_server, tmp_path, agent):
        forged = {**signed("reserve", "h1", 100), "sig": "0" * 64}
        assert send("reserve", forged).status == 401
        assert send("reserve", signed("reserve", "h1", 100, time.time() - 3600)).status == 401
        altered = {**signed("reserve", "h1", 100), "amount": Spend(0, 1).to_json()}
        assert send("reserve", altered).status == 401
        assert send("settle", signed("reserve", "h1", 100)).status == 400  # another op
        assert send("reserve", {"hold": "h1"}).status == 400
        assert day_spent(restate_server, agent)["held"]["tokens"] == 0  # none of them held

        reserve = signed("reserve", "h1", 600)
        assert send("reserve", reserve).json() == {"granted": True}
        assert send("reserve", signed("reserve", "h2", 1_500)).json()["refusal"]["held"] == {
            "cost_usd": 0.0,
            "tokens": 600,
        }
        settle = signed("settle", "h1", 300)
        assert send("settle", settle).status == 200
        assert send("settle", settle).status == 200  # the same again: counted once
        assert send("reserve", reserve).json() == {"granted": True}  # and no new hold
        day = day_spent(restate_server, agent)
        assert day["spent"]["tokens"] == 300 and day["held"]["tokens"] == 0


def test_a_models_own_cap_sends_its_runs_to_the_fallback_across_workers(
    restate_server: RestateServer, tmp_path: Path
) -> None:
    """A day's cap on the model `s` alone: once its calls reach it, runs are answered by the
    fallback `f`, on this worker and on the next; the agent's count has every model's calls."""
    agent = "tiered"
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    caps = {"spendCaps": [{"per": "day", "maxTokens": 700, "model": "s"}]}
    fallback = {"provider": "scripted", "name": "f", "maxTokens": 100}
    fallbacks = [fallback | {"script": [{"text": "from f", "usage": USED}]}]
    with worker(
        restate_server, tmp_path, agent, caps, fallbacks, PROMETHEUS_MULTIPROC_DIR=str(metrics)
    ):
        results = [run(restate_server, agent) for _ in range(5)]
        day = day_spent(restate_server, agent)
    assert [r["status"] for r in results] == ["completed"] * 5, results
    answers = [r["text"] for r in results]
    on_s = answers.count("ok")  # the model's own script answers "ok"
    assert on_s >= 1 and answers == ["ok"] * on_s + ["from f"] * (5 - on_s)
    assert day["models"]["scripted/s"]["tokens"] == on_s * 250 <= 700
    assert day["models"]["scripted/f"]["tokens"] == (5 - on_s) * 250
    assert day["spent"]["tokens"] == 5 * 250  # the agent's own count: both models
    calls = model_calls(metrics, agent)
    assert (calls[("s", "ok")], calls[("s", "capped")], calls[("f", "ok")]) == (
        on_s,
        5 - on_s,
        5 - on_s,
    )
    with worker(restate_server, tmp_path, agent, caps, fallbacks):  # another worker, same count
        assert run(restate_server, agent)["text"] == "from f"


def test_a_holds_model_is_signed(restate_server: RestateServer, tmp_path: Path) -> None:
    """A worker's hold names its model, which its signature covers: moved to another model, it
    is refused; a hold of a worker from before models had caps names none, and still holds."""
    agent = "labelled"
    caps = [SpendCap.of({"per": "day", "tokens": CAP, "model": "scripted/s"})]
    base = f"{restate_server.ingress_url}/{agent}-spend/all/reserve"
    with worker(restate_server, tmp_path, agent):
        body = spend_request("reserve", "h1", Spend(0, 100), caps, time.time(), "scripted/s")
        signed = {**body, "sig": spend_signature(SECRET, body)}
        assert http("POST", base, {**signed, "model": "scripted/other"}).status == 401
        unsigned_model = {k: v for k, v in signed.items() if k != "model"}
        assert http("POST", base, unsigned_model).status == 401
        old = spend_request("reserve", "h2", Spend(0, 100), caps, time.time())
        assert "model" not in old
        assert http("POST", base, {**old, "sig": spend_signature(SECRET, old)}).json() == {
            "granted": True
        }
        assert http("POST", base, signed).json() == {"granted": True}
        assert day_spent(restate_server, agent)["held"]["tokens"] == 200
