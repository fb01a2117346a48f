"""`tether run` as a user runs it: a real process, real files."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.model_server import ErrorReply, ModelServer, Reply
from tether.messages import text_of
from tether.session import load_session, sqlite_store
from tether.spec import SpecError, load_agent, parse_agent

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PROC_PROBE = Path(__file__).resolve().parent / "programs" / "proc_probe.py"
NO_KEYS = {"PATH": "/usr/bin:/bin"}


def state_home(cwd: Path) -> Path:
    """`XDG_STATE_HOME` of the commands a test runs in `cwd`: next to it, not in it."""
    return cwd.with_name(f"{cwd.name}-state")


def runs_db(cwd: Path) -> Path:
    """The runs' SQLite file of `tether run` in `cwd` by default (outside the workspace)."""
    return state_home(cwd) / "tether" / "runs.db"


def tether(
    *args: str,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "tether", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **NO_KEYS,
            "XDG_STATE_HOME": str(state_home(cwd)),
            "XDG_CACHE_HOME": str(cwd.with_name(f"{cwd.name}-cache")),  # MCP servers' homes
            **(env or {}),
        },
    )


def test_run_the_example_with_the_scripted_model(tmp_path: Path) -> None:
    (tmp_path / "CHANGELOG.md").write_text("# 1.4.0\n")
    spec = str(EXAMPLES / "release_clerk.yaml")
    done = tether("run", spec, "--run-id", "t", "--prompt", "ship it", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "model: scripted" in done.stdout
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["stats"]["status"] == "completed"
    assert (tmp_path / "report.md").read_text() == "Release 1.4.0 is live and healthy.\n"
    # Running it again replays the finished run: nothing runs live, nothing is redone.
    again = tether("run", spec, "--run-id", "t", "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    replay = json.loads(again.stdout.splitlines()[-1])
    assert replay["live"] == {} and replay["stats"] == result["stats"]
    assert (tmp_path / "ledger.log").read_text().count("deploy 1.4.0 started") == 1


def test_an_invalid_manifest_is_a_clear_error_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: tether.dev/v1alpha1\nkind: DurableAgent\nmetadata: {name: x}\n"
        "spec:\n  model: {provider: anthropic, name: c}\n  tools: [{name: t, builtin: shell2}]\n"
    )
    done = tether("run", str(bad), "--run-id", "t", "--prompt", "p", cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "spec.tools[0].builtin" in done.stderr


def test_a_first_start_needs_a_prompt(tmp_path: Path) -> None:
    done = tether("run", str(EXAMPLES / "release_clerk.yaml"), "--run-id", "t", cwd=tmp_path)
    assert done.returncode == 2 and "--prompt is required" in done.stderr


INVALID = [
    ({"kind": "Agent"}, "kind"),
    ({"apiVersion": "v1"}, "apiVersion"),
    ({"metadata": {"name": "Bad_Name"}}, "metadata.name"),
    ({"spec": {"model": {"provider": "gemini", "name": "x"}}}, "spec.model.provider"),
    ({"spec": {"model": {"provider": "anthropic", "name": ""}}}, "spec.model.name"),
    ({"spec": {"model": {"provider": "anthropic", "name": "c", "maxTokens": 0}}}, "maxTokens"),
    ({"spec": {"model": {"provider": "scripted", "name": "s"}}}, "needs `script`"),
    (
        {"spec": {"model": {"provider": "anthropic", "name": "c"}, "limits": {"maxTurns": 0}}},
        "spec.limits.maxTurns",
    ),
    (
        {"spec": {"model": {"provider": "anthropic", "name": "c"}, "limits": {"maxCostUsd": -1}}},
        "spec.limits.maxCostUsd",
    ),
    ({"spec": {"model": {"provider": "anthropic", "name": "c"}, "limts": {}}}, "spec.limts"),
    (
        {
            "spec": {
                "model": {"provider": "anthropic", "name": "c"},
                "tools": [{"name": "a b", "builtin": "read_file"}],
            }
        },
        "spec.tools[0].name",
    ),
    (
        {"spec": {"model": {"provider": "anthropic", "name": "c"}, "tools": [{"name": "a"}]}},
        "exactly one of `builtin`, `python` or `mcp`",
    ),
    (
        {
            "spec": {
                "model": {"provider": "anthropic", "name": "c"},
                "tools": [{"name": "a", "python": "not a path"}],
            }
        },
        "spec.tools[0].python",
    ),
    (
        {
            "spec": {
                "model": {"provider": "anthropic", "name": "c"},
                "tools": [
                    {"name": "a", "builtin": "read_file"},
                    {"name": "a", "builtin": "list_files"},
                ],
            }
        },
        "repeated: a",
    ),
    (
        {
            "spec": {
                "model": {"provider": "anthropic", "name": "c"},
                "behavior": {"compactStrategy": "head"},
            }
        },
        "spec.behavior.compactStrategy",
    ),
    (
        {
            "spec": {
                "model": {"provider": "anthropic", "name": "c"},
                "tools": [{"name": "a", "builtin": "read_file", "timeout": "0s"}],
            }
        },
        "spec.tools[0].timeout",
    ),
    (
        {
            "spec": {
                "model": {"provider": "anthropic", "name": "c"},
                "approvals": {"timeout": "0s"},
            }
        },
        "spec.approvals.timeout",
    ),
    (
        {
            "spec": {
                "model": {"provider": "anthropic", "name": "c"},
                "limits": {"onExhausted": "ask"},
            }
        },
        "limits.onExhausted: ask needs",
    ),
]


@pytest.mark.parametrize(("change", "named"), INVALID)
def test_invalid_specs_name_the_field(change: dict[str, object], named: str) -> None:
    manifest: dict[str, object] = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "ok"},
        "spec": {"model": {"provider": "anthropic", "name": "c"}},
    }
    manifest.update(change)
    with pytest.raises(SpecError, match=named.replace("[", r"\[").replace("]", r"\]")):
        parse_agent(manifest)


def test_the_example_manifest_is_valid() -> None:
    agent = load_agent(EXAMPLES / "release_clerk.yaml")
    assert agent.metadata.name == "release-clerk"
    assert [t.name for t in agent.spec.tools][-1] == "check_health"
    assert agent.spec.model.pricing is not None and agent.spec.model.pricing.output_per_m_tok == 15


def test_a_worker_without_its_model_key_says_which_variable(tmp_path: Path) -> None:
    manifest = tmp_path / "agent.yaml"
    manifest.write_text(
        "apiVersion: tether.dev/v1alpha1\nkind: DurableAgent\nmetadata: {name: a}\n"
        "spec: {model: {provider: anthropic, name: claude-sonnet-4-5}}\n"
    )
    done = tether("worker", "--spec", str(manifest), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "tether: ANTHROPIC_API_KEY is not set: the worker needs the model's API key"
    )


@pytest.mark.parametrize(
    ("args", "env", "error"),
    [
        (
            [],
            {"TETHER_WORKER_SERVES": "runs"},
            "tether: TETHER_WORKER_SERVES must be all, agent or index (what the worker serves: "
            "the agent with its index of parked calls and live events, the agent alone, or that "
            "index alone), not 'runs'",
        ),
        (
            ["--serve", "index"],
            {"TETHER_WORKER_METRICS_PORT": "metrics"},
            "tether: TETHER_WORKER_METRICS_PORT must be a port number from 1 to 65535 (where the "
            "worker serves its own /metrics), or unset",
        ),
        (
            ["--serve", "index", "--port", "9090", "--metrics-port", "9090"],
            {},
            "tether: the metrics port 9090 is --port: give it a port of its own",
        ),
    ],
    ids=["unknown role", "metrics port not a number", "metrics port is the Restate port"],
)
def test_a_worker_says_which_role_or_metrics_port_setting_is_wrong(
    tmp_path: Path, args: list[str], env: dict[str, str], error: str
) -> None:
    manifest = tmp_path / "agent.yaml"
    manifest.write_text(
        "apiVersion: tether.dev/v1alpha1\nkind: DurableAgent\nmetadata: {name: a}\n"
        "spec: {model: {provider: anthropic, name: claude-sonnet-4-5}}\n"
    )
    done = tether("worker", "--spec", str(manifest), *args, cwd=tmp_path, env=env)
    assert (done.returncode, done.stderr.strip()) == (2, error)


def test_the_worker_flags_take_only_known_roles_and_ports(tmp_path: Path) -> None:
    from tether.programs.cli import WORKER_SERVES
    from tether.programs.worker.settings import SERVES

    assert WORKER_SERVES == SERVES
    for args, error in [
        (["--serve", "runs"], "argument --serve: invalid choice: 'runs'"),
        (["--metrics-port", "0"], "argument --metrics-port: '0' is not a port number (1-65535)"),
    ]:
        done = tether("worker", "--spec", "agent.yaml", *args, cwd=tmp_path)
        assert done.returncode == 2 and error in done.stderr, done.stderr


def write_manifest(directory: Path, tools: list[dict[str, Any]], script: list[Any]) -> Path:
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "probe"},
        "spec": {"model": {"provider": "scripted", "name": "s", "script": script}, "tools": tools},
    }
    path = directory.with_name(f"{directory.name}-agent.yaml")  # outside the workspace
    path.write_text(yaml.safe_dump(document))
    return path


def tool_results(db: Path, run_id: str) -> list[str]:
    async def read() -> list[str]:
        session = await load_session(sqlite_store(db), run_id)
        assert session is not None
        return [
            str(block["content"])
            for turn in session.turns
            for block in turn.content
            if block["type"] == "tool_result"
        ]

    return asyncio.run(read())


def test_the_agent_cannot_rewrite_its_own_journal(tmp_path: Path) -> None:
    """`write_file` aimed at the runs' database, where it used to be (`.tether/runs.db` in the
    workspace) and where it is now (outside it): no write reaches the file that journals the
    run, which completes and replays whole."""
    db = runs_db(tmp_path)
    targets = [".tether/runs.db", os.path.relpath(db, tmp_path), str(db)]
    calls = [{"name": "write_file", "input": {"path": t, "content": "garbage"}} for t in targets]
    script = [{"tool_calls": calls}, {"text": "done"}]
    spec = str(write_manifest(tmp_path, [{"name": "write_file", "builtin": "write_file"}], script))
    done = tether("run", spec, "--run-id", "r", "--prompt", "go", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["stats"]["status"] == "completed"
    named = re.search(r"^agent probe, run r in (.+)$", done.stdout, re.MULTILINE)
    assert named, done.stdout
    journal = (tmp_path / named.group(1)).resolve()
    journal_files = {journal.with_name(journal.name + end) for end in ("", "-wal", "-shm")}
    results = tool_results(journal, "r")
    written = [r.removeprefix("wrote 7 bytes to ") for r in results if r.startswith("wrote")]
    assert not {(tmp_path / w).resolve() for w in written} & journal_files, (journal, results)
    assert journal == db.resolve()
    assert results[1:] == [
        f"Tool error: {os.path.relpath(db, tmp_path)!r} is outside the workspace",
        f"Tool error: {str(db)!r} is outside the workspace",
    ]
    again = tether("run", spec, "--run-id", "r", "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout.splitlines()[-1])["live"] == {}  # all of it replayed


@pytest.mark.parametrize("how", ["inside", "the workspace itself", "through a symlink"])
def test_a_database_inside_the_workspace_is_refused(tmp_path: Path, how: str) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (tmp_path / "link").symlink_to(workspace)
    db = {
        "inside": "ws/.tether/runs.db",
        "the workspace itself": "ws",
        "through a symlink": "link/runs.db",
    }[how]
    spec = str(write_manifest(tmp_path, [], [{"text": "done"}]))
    args = ["run", spec, "--run-id", "r", "--prompt", "go", "--workspace", "ws", "--db", db]
    refused = tether(*args, cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr
    assert f"is inside the workspace {workspace}" in refused.stderr
    assert "pass --db outside the workspace" in refused.stderr
    assert sorted(p.name for p in workspace.iterdir()) == []


def without_capabilities() -> list[str]:
    """Run as this uid with no capabilities (tests/restate/support.py says why)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to drop root's capabilities"
    return [setpriv, "--bounding-set", "-all", "--inh-caps", "-all", "--"]


def test_a_shell_command_cannot_read_the_secrets_of_tether_run(tmp_path: Path) -> None:
    """`tether run` holds the model keys (and whatever else its environment has): the agent's
    `shell`, the same user, reads neither its `/proc/<pid>/environ` nor its memory, even
    without its sandbox (a kernel without Landlock; the probe is this Python, outside it)."""
    key, secret = secrets.token_hex(16), secrets.token_hex(16)
    probe = f"cat /proc/$PPID/environ; echo; {sys.executable} {PROC_PROBE} {os.getpid()}"
    config = {"maxOutputBytes": 4 * 1024 * 1024, "sandbox": {"enabled": False}}
    shell = {"name": "sh", "builtin": "shell", "config": config}
    script = [{"tool_calls": [{"name": "sh", "input": {"command": probe}}]}, {"text": "done"}]
    spec = str(write_manifest(tmp_path, [shell], script))
    env = {"ANTHROPIC_API_KEY": key, "TETHER_WEBHOOK_SECRET": secret}
    args = ["run", spec, "--run-id", "r", "--prompt", "look", "--db", str(runs_db(tmp_path))]
    done = tether(*args, cwd=tmp_path, env=env, prefix=without_capabilities())
    assert done.returncode == 0, done.stdout + done.stderr
    [output] = tool_results(runs_db(tmp_path), "r")
    assert "probe done" in output and "self CapEff:\t0000000000000000" in output, output
    assert key not in output and secret not in output, output
    ancestors = re.findall(r"^ancestor (\d+): (.*)\n  (.*)\n  (.*)$", output, re.MULTILINE)
    [(_, _, *read)] = [a for a in ancestors if "-m tether run" in a[1]]
    assert read == [
        "environ: cannot read (Permission denied)",
        "memory: cannot read (Permission denied)",
    ], output


class _FlakySidecar:
    """A stand-in sidecar answering `/v1/awakeables/.../resolve` 503 (as the sidecar does while
    Restate has no leader for the call's partition) `failures` times, then 200; it verifies each
    request's signature and keeps them."""

    def __init__(self, secret: str, failures: int) -> None:
        import http.server
        import threading

        from tether.programs.webhooks import verify_request

        self.signatures: list[str] = []
        sidecar = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                sidecar.signatures.append(
                    verify_request(secret.encode(), body, dict(self.headers), path=self.path)
                )
                failed = len(sidecar.signatures) <= failures
                answer = b'{"outcome": "restate_unavailable"}' if failed else b'{"ok": true}'
                self.send_response(503 if failed else 200)
                if failed:
                    self.send_header("retry-after", "0")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(("retry_for", "sent", "code"), [("30", 3, 0), ("0", 1, 1)])
def test_tether_resolve_sends_again_newly_signed_while_the_sidecar_answers_503(
    tmp_path: Path, retry_for: str, sent: int, code: int
) -> None:
    secret = secrets.token_urlsafe(16)
    sidecar = _FlakySidecar(secret, failures=2)
    try:
        done = tether(
            "resolve", "sign_1abc", "--retry-for", retry_for, "--sidecar", sidecar.url,
            cwd=tmp_path,
            env={"TETHER_WEBHOOK_SECRET": secret},
        )  # fmt: skip
    finally:
        sidecar.close()
    assert done.returncode == code, done.stderr
    assert len(sidecar.signatures) == len(set(sidecar.signatures)) == sent
    if code:  # the refusal, and why, on stderr
        assert done.stderr.startswith("503 ") and "restate_unavailable" in done.stderr
    else:
        assert done.stderr.count("sending again") == 2 and done.stdout.startswith("200 ")


def test_tether_run_asks_the_fallback_model_when_the_first_fails(
    tmp_path: Path, model_server: ModelServer
) -> None:
    model_server.script(ErrorReply(529, "Overloaded", "overloaded_error"), Reply(text=["hi"]))
    manifest = tmp_path / "agent.yaml"
    fallback = {"provider": "openai", "name": "gpt-test", "baseUrl": model_server.openai_url}
    model = {"provider": "anthropic", "name": "claude-test", "baseUrl": model_server.anthropic_url}
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "a"},
        "spec": {"model": {**model, "fallbacks": [fallback]}},
    }
    manifest.write_text(yaml.safe_dump(document))
    args = ("run", str(manifest), "--run-id", "r", "--prompt", "hi", "--json")
    # The fallback's key is needed too, and named.
    missing = tether(*args, cwd=tmp_path, env={"ANTHROPIC_API_KEY": "a"})
    assert missing.returncode == 2 and model_server.requests == []
    assert "OPENAI_API_KEY is not set: the worker needs spec.model.fallbacks[0]'s" in (
        missing.stderr
    )
    keys = {"ANTHROPIC_API_KEY": "a", "OPENAI_API_KEY": "o"}
    done = tether(*args, cwd=tmp_path, env=keys)
    assert done.returncode == 0, done.stderr
    assert "model: anthropic/claude-test, then openai/gpt-test" in done.stdout
    result = json.loads(done.stdout.splitlines()[-1])
    assert (result["stats"]["status"], result["stats"]["text"]) == ("completed", "hi")
    again = tether(*args[:-3], "--json", cwd=tmp_path, env=keys)  # replayed: no model asked
    assert again.returncode == 0, again.stderr
    assert [r.path.rsplit("/", 1)[-1] for r in model_server.requests] == [
        "messages",
        "completions",
    ]


CRASHING_SHELL = {"name": "sh", "builtin": "shell", "config": {"sandbox": {"enabled": False}}}
"""A shell that may kill `tether run` (the crash of these tests): its sandbox would refuse."""


def test_tether_run_killed_mid_run_keeps_counting_the_answers_that_missed_its_output(
    tmp_path: Path,
) -> None:
    script = [
        {"text": "it is 42"},  # a miss: text only
        {"tool_calls": [{"name": "sh", "input": {"command": "kill -9 $PPID"}}]},  # SIGKILL
        {"tool_calls": [{"name": "final_answer", "input": {"value": "42"}}]},  # the second
        {"tool_calls": [{"name": "final_answer", "input": {"value": 42}}]},
    ]
    path = write_manifest(tmp_path, [CRASHING_SHELL], script)
    document = yaml.safe_load(path.read_text())
    document["spec"]["output"] = {"schema": {"type": "integer"}, "retries": 1}
    path.write_text(yaml.safe_dump(document))
    args = ("run", str(path), "--run-id", "r", "--prompt", "what is it?", "--json")
    killed = tether(*args, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # The resumed run counts the journal's miss: the value that does not match is its second.
    resumed = tether(*args, cwd=tmp_path)
    assert resumed.returncode == 1, resumed.stderr
    stats = json.loads(resumed.stdout.splitlines()[-1])["stats"]
    assert stats["status"] == "error" and "output" not in stats
    assert stats["error"].startswith("the final answer did not match its schema 2 times: ")
    assert "'42' is not of type 'integer'" in stats["error"]


def test_tether_run_killed_inside_a_named_sub_agent_resumes_it_to_its_output(
    tmp_path: Path,
) -> None:
    spawn = {"task": "check the change", "agent": "reviewer"}
    script = {  # by the first user message: the agent's, then the reviewer's
        "ship it": [{"tool_calls": [{"name": "spawn", "input": spawn}]}, {"text": "shipped"}],
        "check the change": [
            {"tool_calls": [{"name": "sh", "input": {"command": "kill -9 $PPID"}}]},  # SIGKILL
            {"tool_calls": [{"name": "final_answer", "input": {"ok": True}}]},
        ],
    }
    tools = [CRASHING_SHELL, {"name": "read", "builtin": "read_file"}]
    path = write_manifest(tmp_path, tools, [])
    document = yaml.safe_load(path.read_text())
    document["spec"]["model"]["script"] = script
    reviewer = {"name": "reviewer", "description": "Reviews.", "tools": ["sh"]}
    reviewer["output"] = {"schema": {"type": "object", "required": ["ok"]}}
    document["spec"]["subagents"] = {"maxDepth": 1, "agents": [reviewer]}
    path.write_text(yaml.safe_dump(document))
    args = ("run", str(path), "--run-id", "r", "--prompt", "ship it", "--json")
    killed = tether(*args, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = tether(*args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    stats = json.loads(resumed.stdout.splitlines()[-1])["stats"]
    assert (stats["status"], stats["text"]) == ("completed", "shipped")
    [child] = stats["children"]
    assert (child["output"], child["tool_calls"]) == ({"ok": True}, 2)
    assert tool_results(runs_db(tmp_path), "r") == ['{"ok":true}']


def test_tether_run_fans_out_like_the_worker_on_kubernetes(tmp_path: Path) -> None:
    # The e2e fan-out agent, run embedded: two tasks to a named sub-agent, run at once.
    fanout = EXAMPLES.parent / "e2e" / "fanout-agent.yaml"
    args = ("run", str(fanout), "--run-id", "r", "--prompt", "count the fruit", "--json")
    done = tether(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout.splitlines()[-1])["stats"]
    assert [child["output"] for child in stats["children"]] == [{"count": 3}, {"count": 3}]
    answer = '[child-1] {"count":3}\n\n[child-2] {"count":3}'  # as the worker's
    assert tool_results(runs_db(tmp_path), "r") == [answer]


def test_tether_run_forks_a_session_after_an_answer(tmp_path: Path) -> None:
    spec = str(write_manifest(tmp_path, [], [{"text": "one"}, {"text": "two"}, {"text": "3"}]))
    db = runs_db(tmp_path)
    for run_id, prompt in (("r1", "hi"), ("r2", "again")):
        done = tether(
            "run", spec, "--run-id", run_id, "--session", "s1", "--prompt", prompt, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr

    def sessions() -> dict[str, Any]:
        async def read() -> dict[str, Any]:
            store = sqlite_store(db)
            return {s: await load_session(store, s) for s in ("s1", "s2")}

        return asyncio.run(read())

    before = sessions()["s1"]
    # A cut inside an exchange is refused, saying where a fork may end; nothing is made.
    refused = tether(
        "run",
        spec,
        "--run-id",
        "f0",
        "--session",
        "s2",
        "--fork",
        "s1:3",
        "--prompt",
        "x",
        cwd=tmp_path,
    )
    assert refused.returncode == 2
    assert "turn 3 of session 's1' is not an answer" in refused.stderr
    assert "answers at turns: 2, 4" in refused.stderr
    assert sessions()["s2"] is None

    forked = tether(
        "run",
        spec,
        "--run-id",
        "f1",
        "--session",
        "s2",
        "--fork",
        "s1:2",
        "--prompt",
        "instead",
        "--json",
        cwd=tmp_path,
    )
    assert forked.returncode == 0, forked.stderr
    assert json.loads(forked.stdout.splitlines()[-1])["stats"]["text"] == "two"
    after = sessions()
    s1, s2 = after["s1"], after["s2"]
    assert [t.id for t in s1.turns] == [t.id for t in before.turns]  # the source stays
    assert [t.id for t in s2.turns[:2]] == [t.id for t in s1.turns[:2]]
    assert [text_of(t.content) for t in s2.turns] == ["hi", "one", "instead", "two"]
    assert s2.metadata["forked_from"] == {"session": "s1", "turns": 2}
    # The same run again replays its fork; another fork into s2 is refused.
    again = tether(
        "run", spec, "--run-id", "f1", "--session", "s2", "--fork", "s1:2", "--json", cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.splitlines()[-1])["live"] == {}
    twice = tether(
        "run",
        spec,
        "--run-id",
        "f2",
        "--session",
        "s2",
        "--fork",
        "s1",
        "--prompt",
        "x",
        cwd=tmp_path,
    )
    assert twice.returncode == 2 and "session 's2' exists" in twice.stderr


@pytest.mark.parametrize("zone", [None, "Pacific/Kiritimati"])
def test_tether_runs_on_one_file_share_the_agents_spend_cap(
    tmp_path: Path, zone: str | None
) -> None:
    cap = {"per": "day", "maxTokens": 400, **({"timeZone": zone} if zone else {})}
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "frugal"},
        "spec": {
            "model": {
                "provider": "scripted",
                "name": "s",
                "maxTokens": 100,
                "script": [{"text": "ok", "usage": {"input": 200, "output": 50}}],
            },
            "webhook": {"secretRef": {"name": "hook", "key": "key"}},  # Kubernetes' signer
            "limits": {"spendCaps": [cap]},
        },
    }
    manifest = tmp_path / "agent.yaml"
    manifest.write_text(yaml.safe_dump(document))

    def run(run_id: str, *db: str) -> dict[str, Any]:
        done = tether(
            "run", str(manifest), "--run-id", run_id, "--prompt", "go", "--json", *db, cwd=tmp_path
        )
        assert done.returncode in (0, 1), done.stderr
        stats: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])["stats"]
        return stats

    assert run("first")["status"] == "completed"  # 250 tokens spent
    refused = run("second")  # another process: 250 spent + its call's worst case > 400
    assert refused["status"] == "budget_exceeded"
    assert (
        f"the agent's spend cap of 400 tokens a day ({zone or 'UTC'}) is reached"
        in (refused["error"])
    )
    # The day of the cap's zone: it resets at midnight there (UTC+14), and says so.
    midnight = "T00:00:00+14:00 (" if zone else "T00:00:00Z"
    assert midnight in refused["error"], refused["error"]
    elsewhere = str(state_home(tmp_path) / "other.db")  # another file, another count
    assert run("elsewhere", "--db", elsewhere)["status"] == "completed"
