"""Sub-agents in the worker and the exact metrics of a run that fans out, parks and survives a
SIGKILL, and of parks that end by an answer and by their timeout, read from the sidecar's
`/metrics` of the local stack (restate-server, `tether worker` and `tether sidecar` as real
processes)."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.restate.support import attach, decide_by_link, group_alive, send_run, wait_until
from tether.programs.dev import DevStack, wait_for
from tether.programs.webhooks import sign_request, signed_link

AGENT = "fanout-clerk"
PROMPT = "triage the release"
SUBJECTS = ("alpha", "beta", "gamma")
TASKS = [f"check {s}" for s in SUBJECTS]
ANSWER_TIMEOUT = 180.0

PARENT: list[dict[str, Any]] = [
    {
        "tool_calls": [{"name": "spawn", "input": {"tasks": TASKS}}],
        "usage": {"input": 100, "output": 20},
    },
    {
        "tool_calls": [{"name": "ask", "input": {"question": "Ship it?"}}],
        "usage": {"input": 200, "output": 15},
    },
    {"text": "shipped", "usage": {"input": 300, "output": 5}},
]
MAX_CONCURRENT = 2
"""Children of one spawn call running at once: the three start in two waves (2, then 1)."""
PARKED_AT = 1
"""The parent parks on `ask` in the response at this index; the kill comes while it waits."""


def child_script(subject: str) -> list[dict[str, Any]]:
    write = {"name": "write_file", "input": {"path": f"{subject}.txt", "content": subject}}
    return [
        {"tool_calls": [write], "usage": {"input": 40, "output": 8}},
        {"text": f"{subject} ok", "usage": {"input": 50, "output": 3}},
    ]


SCRIPT: dict[str, list[dict[str, Any]]] = {
    PROMPT: PARENT,
    **{task: child_script(subject) for task, subject in zip(TASKS, SUBJECTS, strict=True)},
}
SELF_JOURNALED = {"spawn", "ask"}
"""Tools that journal their own steps: one `tool-check` decision step each, then their body."""


def manifest(
    directory: Path,
    script: Any,
    tools: list[dict[str, Any]],
    *,
    max_depth: int = 1,
    approvals: dict[str, Any] | None = None,
) -> Path:
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": AGENT},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": script},
            "tools": tools,
            "subagents": {"maxDepth": max_depth, "maxConcurrent": MAX_CONCURRENT},
            **({"approvals": approvals} if approvals else {}),
        },
    }
    path = directory / f"{AGENT}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def outside(workspace: Path) -> Path:
    """The stack's data dir: next to the workspace (inside it, `DevStack` refuses it)."""
    return workspace.with_name(f"{workspace.name}-dev")


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TETHER_WORKSPACE", str(tmp_path))
    monkeypatch.delenv("TETHER_WEBHOOK_SECRET", raising=False)
    return tmp_path


# Reading the stack -------------------------------------------------------------------------


Sample = tuple[str, frozenset[tuple[str, str]]]


def scrape(stack: DevStack) -> dict[Sample, float]:
    """Every sample of the sidecar's `/metrics`, by name and labels."""
    response = httpx2.get(f"{stack.sidecar_url}/metrics", timeout=30)
    assert response.status_code == 200, response.text
    samples: dict[Sample, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict[Sample, float], name: str, **values: str) -> float:
    """The sample of `name` with exactly these labels (the agent's included); 0 if absent."""
    return samples.get((name, labels(**values)), 0.0)


def labels(**values: str) -> frozenset[tuple[str, str]]:
    """A label set of the agent's series."""
    return frozenset({"agent": AGENT, **values}.items())


def series(samples: dict[Sample, float], name: str) -> dict[frozenset[tuple[str, str]], float]:
    """All label sets of `name` with a non-zero value."""
    return {label_set: v for (n, label_set), v in samples.items() if n == name and v}


def parked(stack: DevStack) -> list[dict[str, Any]]:
    headers = sign_request(stack.secret.encode(), b"", path="/v1/approvals")
    response = httpx2.get(f"{stack.sidecar_url}/v1/approvals", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    calls: list[dict[str, Any]] = response.json()["parked"]
    return calls


def start_run(stack: DevStack, session: str, prompt: str) -> str:
    return send_run(stack.server.ingress_url, stack.agent, session, prompt)


def result_of(stack: DevStack, invocation: str) -> Any:
    return attach(stack.server.ingress_url, invocation, ANSWER_TIMEOUT)


def session_of(stack: DevStack, session: str) -> Any:
    url = f"{stack.server.ingress_url}/{stack.agent}/{session}/session"
    response = httpx2.post(url, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def pending_of(stack: DevStack, session: str) -> list[dict[str, Any]]:
    url = f"{stack.server.ingress_url}/{stack.agent}/{session}/pending"
    response = httpx2.post(url, timeout=30)
    assert response.status_code == 200, response.text
    calls: list[dict[str, Any]] = response.json()
    return calls


def state_keys(stack: DevStack, session: str) -> list[str]:
    """The object's state keys for one session, from Restate's SQL introspection."""
    rows = stack.server.query(
        f"SELECT key FROM state WHERE service_name = '{stack.agent}' AND service_key = '{session}'"
    )
    return [row["key"] for row in rows]


def kill_and_restart_worker(stack: DevStack) -> None:
    """SIGKILL the worker's process group, wait until every member is gone, start it again on
    the same port (Restate retries the killed attempt there)."""
    popen = stack.worker.popen
    assert popen is not None
    pgid = popen.pid
    stack.worker.kill(signal.SIGKILL)
    wait_until(lambda: not group_alive(pgid), timeout=60, what="the killed worker to exit")
    stack.worker.start()
    wait_for(f"{stack.worker_url}/health", "worker", stack.worker, timeout=120)


# What the script journals ------------------------------------------------------------------


def steps_before(script: list[dict[str, Any]], responses: int) -> Counter[str]:
    """The steps (by kind) a run of `script` has journaled once it is inside the tool calls of
    response `responses - 1`: per response a `model:N:0` step (which decides whether the turn
    happens before it calls the model); per call
    of an earlier response its tool step, or for a self-journaled tool its `tool-check`
    decision (plus one `spawn:complete` decision per spawn call); the tool calls of the last
    response have journaled their `tool-check` when the call parks. The clock reads of the run
    are `ctx.time()` entries, not runtime steps."""
    steps: Counter[str] = Counter()
    for index, response in enumerate(script[:responses]):
        steps["model"] += 1  # model:N:0
        for call in response.get("tool_calls") or []:
            if call["name"] in SELF_JOURNALED:
                steps["decision"] += 1  # tool-check:<call id>
                if call["name"] == "spawn" and index < responses - 1:
                    steps["decision"] += 1  # spawn:complete
            elif index < responses - 1:
                steps["tool"] += 1
    return steps


def usage(script: list[dict[str, Any]], kind: str) -> int:
    return sum(int(r["usage"][kind]) for r in script)


def tool_calls(script: list[dict[str, Any]]) -> Counter[str]:
    return Counter(c["name"] for r in script for c in r.get("tool_calls") or [])


# The tests ---------------------------------------------------------------------------------


@pytest.fixture
def fanout_stack(workspace: Path) -> Iterator[DevStack]:
    tools = [
        {"name": "write_file", "builtin": "write_file"},
        {"name": "ask", "builtin": "ask_human"},
    ]
    with DevStack(manifest(workspace, SCRIPT, tools), outside(workspace)) as stack:
        yield stack


def test_a_fan_out_that_parks_and_survives_a_kill_is_counted_exactly_once(
    fanout_stack: DevStack, workspace: Path
) -> None:
    stack = fanout_stack
    invocation = start_run(stack, "s1", PROMPT)
    [call] = wait_until(lambda: parked(stack), timeout=ANSWER_TIMEOUT, what="the parked question")
    assert (call["kind"], call["tool"], call["session"]) == ("ask_human", "ask", "s1")
    for subject in SUBJECTS:
        assert (workspace / f"{subject}.txt").read_text() == subject

    # While parked: the children and the parent's first two turns are counted, nothing else.
    children = [child_script(s) for s in SUBJECTS]
    child_calls = sum(len(c) for c in children)
    scraped_from = time.time()
    before = scrape(stack)
    scraped_by = time.time()
    assert value(before, "tether_parked_calls", kind="ask_human") == 1
    # The oldest parked call's age, from its record's start to the scrape.
    parked_since = call["created_at"] / 1000
    age = value(before, "tether_parked_oldest_seconds")
    assert scraped_from - parked_since - 0.01 <= age <= scraped_by - parked_since + 0.01
    assert series(before, "tether_parked_duration_seconds_count") == {}  # nothing ended yet
    assert value(before, "tether_runs_total", status="completed") == len(SUBJECTS)
    model = {"provider": "scripted", "model": "s", "outcome": "ok"}
    assert value(before, "tether_model_calls_total", **model) == child_calls + PARKED_AT + 1
    assert value(before, "tether_tool_calls_total", tool="spawn", outcome="ok") == 1
    assert value(before, "tether_tool_calls_total", tool="ask", outcome="ok") == 0
    assert value(before, "tether_replays_total") == 0

    kill_and_restart_worker(stack)
    answered_from = time.time()
    response = httpx2.post(
        f"{stack.server.ingress_url}/restate/awakeables/{call['awakeable_id']}/resolve",
        json={"answer": "yes"},
        timeout=30,
    )
    assert response.status_code in (200, 202), response.text
    result = result_of(stack, invocation)
    answered_by = time.time()
    assert (result["status"], result["text"]) == ("completed", "shipped")
    assert result["turns"] == len(PARENT)

    # The children's run records are in the parent's session, in task order.
    session = session_of(stack, "s1")
    child_runs = [r for r in session["runs"] if r.get("parent_run_id")]
    assert [r["prompt"] for r in child_runs] == TASKS
    assert {r["status"] for r in child_runs} == {"completed"}
    # maxConcurrent 2: the third child started after the first two had finished.
    first_wave, second_wave = child_runs[:MAX_CONCURRENT], child_runs[MAX_CONCURRENT:]
    assert min(r["started_at"] for r in second_wave) >= max(r["ended_at"] for r in first_wave)

    wait_until(
        lambda: value(scrape(stack), "tether_parked_calls", kind="ask_human") == 0,
        timeout=30,
        what="the parked gauge to drop",
    )
    after = scrape(stack)

    # The park, once: answered through Restate's API (no `decided_at`), so it lasted until the
    # resumed attempt ran its `park:end`, between the answer and the run's result.
    assert series(after, "tether_parked_duration_seconds_count") == {labels(kind="ask_human"): 1}
    parked_for = value(after, "tether_parked_duration_seconds_sum", kind="ask_human")
    assert answered_from - parked_since <= parked_for <= answered_by - parked_since
    assert value(after, "tether_parked_oldest_seconds") == 0

    # Runs: the parent and its three children.
    assert series(after, "tether_runs_total") == {labels(status="completed"): 1 + len(SUBJECTS)}
    # Model calls and tokens: every response of every script, once; the replay added none.
    everything = PARENT + [r for c in children for r in c]
    assert series(after, "tether_model_calls_total") == {labels(**model): len(everything)}
    by_model = {"provider": "scripted", "model": "s"}
    assert series(after, "tether_model_call_duration_seconds_count") == {
        labels(**by_model): len(everything)
    }
    tokens = "tether_model_tokens_total"
    assert value(after, tokens, **by_model, kind="input") == usage(everything, "input")
    assert value(after, tokens, **by_model, kind="output") == usage(everything, "output")
    assert set(series(after, tokens)) == {
        labels(**by_model, kind=kind) for kind in ("input", "output")
    }
    # Tool calls by tool and outcome: spawn once (not again when the resumed parent replayed
    # it), ask once (in the attempt that got the answer), write_file once per child (each
    # child ran once, before the kill).
    expected_tools = tool_calls(everything)
    assert expected_tools == {"spawn": 1, "ask": 1, "write_file": len(SUBJECTS)}
    assert series(after, "tether_tool_calls_total") == {
        labels(tool=tool, outcome="ok"): n for tool, n in expected_tools.items()
    }
    for tool, n in expected_tools.items():
        assert value(after, "tether_tool_duration_seconds_count", tool=tool) == n
    assert series(after, "tether_interrupted_tool_calls_total") == {}
    # Children: three completed, from one spawn call of three.
    assert series(after, "tether_children_total") == {labels(status="completed"): len(SUBJECTS)}
    assert value(after, "tether_child_fanout_count") == 1
    assert value(after, "tether_child_fanout_sum") == len(SUBJECTS)
    assert value(after, "tether_child_fanout_bucket", le="2.0") == 0
    assert value(after, "tether_child_fanout_bucket", le="3.0") == 1
    # One replay: the parent's invocation resumed after the kill replayed its journal and went
    # live (the children finished before the kill and never replayed). Its replayed steps are
    # the ones journaled before the kill.
    assert value(after, "tether_replays_total") == 1
    replayed = steps_before(PARENT, PARKED_AT + 1)
    assert replayed == {"decision": 3, "model": 2}
    assert series(after, "tether_replayed_steps_total") == {
        labels(kind=kind): n for kind, n in replayed.items()
    }
    # Nothing else moved between the park and the end but the parent's last turn and the ask.
    assert (
        value(after, "tether_model_calls_total", **model)
        - value(before, "tether_model_calls_total", **model)
        == len(PARENT) - PARKED_AT - 1
    )
    assert value(after, "tether_tool_calls_total", tool="spawn", outcome="ok") == value(
        before, "tether_tool_calls_total", tool="spawn", outcome="ok"
    )


def test_a_grandchild_parks_on_an_approval_under_the_agent(workspace: Path) -> None:
    write = {"name": "write_file", "input": {"path": "notes.txt", "content": "n"}}
    script = {
        "write the notes": [
            {"tool_calls": [{"name": "spawn", "input": {"task": "delegate the notes"}}]},
            {"text": "the notes are written"},
        ],
        "delegate the notes": [
            {"tool_calls": [{"name": "spawn", "input": {"task": "write notes.txt"}}]},
            {"text": "my child wrote them"},
        ],
        "write notes.txt": [{"tool_calls": [write]}, {"text": "written"}],
    }
    tools = [{"name": "write_file", "builtin": "write_file", "requireApproval": True}]
    path = manifest(workspace, script, tools, max_depth=2)
    with DevStack(path, outside(workspace)) as stack:
        invocation = start_run(stack, "s2", "write the notes")
        [call] = wait_until(
            lambda: parked(stack), timeout=ANSWER_TIMEOUT, what="the grandchild's approval"
        )
        assert (call["kind"], call["tool"], call["agent"]) == ("approval", "write_file", AGENT)
        assert call["session"] == "s2::child-1::child-1"
        assert not (workspace / "notes.txt").exists()
        # The session's own `pending` shows what its run waits for, two spawns down.
        # The ingress's `pending` lists it too, without the awakeable id (which answers it).
        listed = {k: v for k, v in call.items() if k != "awakeable_id"}
        assert pending_of(stack, "s2") == [listed]
        assert pending_of(stack, "s2::child-1") == [listed]
        expires = int(time.time()) + 600
        link = signed_link(
            stack.sidecar_url, stack.secret.encode(), "approve", call["awakeable_id"], expires
        )
        assert decide_by_link(link).status == 200
        result = result_of(stack, invocation)
        assert (result["status"], result["text"]) == ("completed", "the notes are written")
        assert (workspace / "notes.txt").read_text() == "n"
        runs = session_of(stack, "s2")["runs"]
        assert [r["prompt"] for r in runs] == [
            "write the notes",
            "delegate the notes",
            "write notes.txt",
        ]
        assert runs[2]["parent_run_id"] == runs[1]["id"]
        wait_until(lambda: parked(stack) == [], timeout=30, what="the record to go")
        assert pending_of(stack, "s2") == []
        assert not [k for k in state_keys(stack, "s2") if k.startswith("tether:child:")]
        metrics = scrape(stack)
        assert value(metrics, "tether_runs_total", status="completed") == 3
        assert series(metrics, "tether_tool_calls_total") == {
            labels(tool="spawn", outcome="ok"): 2,  # the parent's and the child's
            labels(tool="write_file", outcome="ok"): 1,
        }
        assert value(metrics, "tether_children_total", status="completed") == 2
        assert value(metrics, "tether_child_fanout_count") == 2
        assert value(metrics, "tether_child_fanout_sum") == 2


PARK_TIMEOUT = 15.0
"""The approvals' timeout of the test below: longer than the 10 s after which a run that waits
suspends (`PARK_AFTER`), so the second park's timer resumes a suspended invocation, which
replays the first park's end."""


def status_of(stack: DevStack, invocation: str) -> str:
    rows = stack.server.query(f"SELECT status FROM sys_invocation WHERE id = '{invocation}'")
    return str(rows[0]["status"])


def test_parks_are_timed_once_each_whether_answered_or_timed_out(workspace: Path) -> None:
    """Two questions in one run: the first answered through the sidecar (which stamps when it
    was decided), the second left to time out after the run suspended. Each park is observed
    once, with how long it lasted; resuming from the suspension replays the first park's end
    without observing it again."""
    ask = [{"name": "ask", "input": {"question": q}} for q in ("Ship it?", "Tag it?")]
    script = [{"tool_calls": [ask[0]]}, {"tool_calls": [ask[1]]}, {"text": "done"}]
    tools = [{"name": "ask", "builtin": "ask_human"}]
    timeout = {"timeout": f"{PARK_TIMEOUT:g}s"}
    path = manifest(workspace, {"ask twice": script}, tools, approvals=timeout)
    with DevStack(path, outside(workspace)) as stack:
        # Before any run, the series with known labels are there at 0: Prometheus sees the
        # first park (or run, or error) of a new pod as an increase.
        started = scrape(stack)
        for kind in ("approval", "ask_human"):
            assert started[("tether_parked_duration_seconds_count", labels(kind=kind))] == 0
        for status in ("completed", "error"):
            assert started[("tether_runs_total", labels(status=status))] == 0
        assert started[("tether_replays_total", labels())] == 0
        invocation = start_run(stack, "s3", "ask twice")
        [first] = wait_until(lambda: parked(stack), timeout=ANSWER_TIMEOUT, what="the question")
        body = json.dumps({"answer": "yes", "approver": "alice"}).encode()
        path_of = f"/v1/awakeables/{first['awakeable_id']}/resolve"
        headers = {
            **sign_request(stack.secret.encode(), body, path=path_of),
            "content-type": "application/json",
        }
        response = httpx2.post(f"{stack.sidecar_url}{path_of}", content=body, headers=headers)
        assert response.status_code == 202, response.text

        [second] = wait_until(
            lambda: [c for c in parked(stack) if c["awakeable_id"] != first["awakeable_id"]],
            timeout=ANSWER_TIMEOUT,
            what="the second question",
        )
        assert second["expires_at"] - second["created_at"] == PARK_TIMEOUT * 1000
        # One park ended; it is observed although the run has not ended.
        middle = scrape(stack)
        assert series(middle, "tether_parked_duration_seconds_count") == {
            labels(kind="ask_human"): 1
        }
        # The run suspends while it waits; its timer wakes it, and it replays the first park.
        wait_until(
            lambda: status_of(stack, invocation) == "suspended",
            timeout=PARK_TIMEOUT,
            what="the run to suspend before the timeout",
        )
        result = result_of(stack, invocation)
        assert (result["status"], result["text"]) == ("completed", "done")

        [run] = session_of(stack, "s3")["runs"]
        decided = {d["call_id"]: d for d in run["decisions"]}
        answered, timed_out = decided[first["call_id"]], decided[second["call_id"]]
        assert answered["approver"] == "alice" and timed_out.get("timed_out") is True
        after = scrape(stack)
        assert value(after, "tether_replays_total") == 1
        # Twice, not three times: the replayed `park:end` of the first park observed nothing.
        assert series(after, "tether_parked_duration_seconds_count") == {
            labels(kind="ask_human"): 2
        }
        # The first until the sidecar took the answer, the second until its deadline.
        first_for = (answered["decided_at"] - first["created_at"]) / 1000
        assert value(after, "tether_parked_duration_seconds_sum", kind="ask_human") == (
            pytest.approx(first_for + PARK_TIMEOUT, abs=1e-3)
        )
        bucket = "tether_parked_duration_seconds_bucket"
        assert value(after, bucket, kind="ask_human", le="5.0") == 1
        assert value(after, bucket, kind="ask_human", le="15.0") == 2
        assert value(after, "tether_parked_oldest_seconds") == 0
