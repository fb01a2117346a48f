"""`tether crashtest`: kill an agent's run at every journal boundary and inside every tool call,
resume it, and check that nothing was lost or done twice.

The agent runs as `tether run` runs it (the embedded SQLite runtime), against its scripted
model, in a copy of the workspace; API keys are dropped from its environment, so no kill ever
pays a real model. First two runs without a crash: they must agree, or the agent is not
deterministic enough to compare against (a tool that returns the time, a script that depends on
something else). Then one trial per kill point, each in a fresh copy of the workspace and a file
of its own:

- after each commit of the run's SQLite file (a step boundary, a person's answer included),
  the process and all it started are SIGKILLed from inside, right after the commit;
- inside each tool call, after its body returned and before its result is journaled: the
  moment a crash makes the outcome unknown.

The same command then starts the run again until it ends (a park the child answered, with
`approve` or `human_answer`, is started again too; one it did not ends the run, parked).

Each run must end as the clean one did, with no model call made again once its answer was
journaled, no `replay: unsafe` tool body run twice, no result journaled before the kill lost
(reported as interrupted, or its body run again), every tool call answered exactly once, and
the same transcript and workspace files as the clean run's, except where a call the crash cut
off was reported to the model as interrupted (sub-agents' transcripts are not kept: their calls
are counted and killed in, their turns not compared). A `replay:
safe` tool that runs again must leave the same transcript and files: that is what `safe`
promises, and where it does not, the trial fails naming the tool.

The child processes (`python -m tether.programs.crashtest`) are `tether run` with a recorder:
a commit observer (`Database.committed`), a wrapper of the spec's tools and hooks append one
line per event to a file of the trial's (fsynced, so a SIGKILL loses none of them).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from .._sqlite import Database, Params
from ..durable import run_status
from ..durable.answers import AnswerBook
from ..errors import ConfigError
from ..session import INTERRUPTED_RESULT
from ..spec import DEFAULT_KEY_ENV, load_agent
from ..tools.base import ToolContext, ToolDef, ToolOutput
from .run import PARKED_EXIT, run_command, script_file

RUN_ID = "crashtest"
CHILD_TIMEOUT_S = 300.0
MAX_STARTS = 100
"""Of one run: its kill, then its parks answered (each a start)."""
WORKSPACE_MARK = "<workspace>"
"""Each run's workspace path, in what is compared: every run has a directory of its own."""


# The child: `tether run` with a recorder -------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Recorder:
    """Appends what the run does to `path`, one fsynced line per event, and kills the process
    at the trial's kill point. Commits are counted across the run's processes (a run resumed
    after a park goes on counting), so a kill point names one moment of the run."""

    def __init__(self, path: Path, kill_after_commit: int | None, kill_in_call: str | None):
        self.path = path
        self.kill_after_commit = kill_after_commit
        self.kill_in_call = kill_in_call  # RUN/CALL
        self.commits = Events.read(path).commits
        self.wrapped: set[str] = set()  # tools whose bodies `wrap` counts
        self._lock = threading.Lock()  # commits come from the threads that make them

    def note(self, *words: object) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (" ".join(map(str, words)) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def kill(self) -> None:
        """As a pod dies: this process and all it started, in its group or in sessions of
        their own (`shell` commands)."""
        self.note("kill")
        groups = set()
        for pid in _descendants(os.getpid()):
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(pid))
        for group in groups - {os.getpgrp()}:  # before its own, which this process is in
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
        os.killpg(0, signal.SIGKILL)

    def _kill_in(self, run_id: str, call_id: str) -> None:
        if f"{run_id}/{call_id}" == self.kill_in_call:
            self.kill()

    def committed(self, writes: Sequence[tuple[str, Params]]) -> None:
        steps = [p[4] for sql, p in writes if sql.startswith("INSERT INTO tether_steps")]
        with self._lock:
            self.commits += 1
            self.note("commit", self.commits, *steps)
            if self.commits == self.kill_after_commit:
                self.kill()

    def wrap(self, tool: ToolDef) -> ToolDef:
        """A built-in or `python` tool whose body is counted as it starts, and killed in as it
        ends (an approval gate's too, whose hooks fire on replays). A self-journaled one runs
        again on every replay: not counted."""
        if tool.self_journaled:
            return tool
        self.wrapped.add(tool.name)
        execute, uses_context = tool.execute, tool.uses_context

        async def counted(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
            self.note("tool", ctx.run_id, ctx.call_id, tool.name, tool.replay)
            try:
                return await execute(arguments, ctx if uses_context else cast(ToolContext, None))
            finally:
                self._kill_in(ctx.run_id, ctx.call_id)

        return dataclasses.replace(tool, execute=counted, uses_context=True)

    def hooks(self) -> dict[str, Any]:
        def counted_here(payload: dict[str, Any]) -> bool:
            # An MCP tool's call (a self-journaled one's hooks fire on replays too: not counted).
            return payload["name"] not in self.wrapped and not payload.get("self_journaled")

        def tool_before(payload: dict[str, Any]) -> None:
            if counted_here(payload):
                self.note("tool", payload["run_id"], payload["call_id"], payload["name"],
                          payload.get("replay", "unsafe"))  # fmt: skip

        def tool_after(payload: dict[str, Any]) -> None:
            # Cut off by a crash: sub-agents' transcripts are not kept, so it is said here.
            if payload["outcome"] == "interrupted" or INTERRUPTED_RESULT in str(payload["result"]):
                self.note("cut", payload["run_id"], payload["call_id"])
            if counted_here(payload):
                self._kill_in(payload["run_id"], payload["call_id"])

        def turn_after(payload: dict[str, Any]) -> None:  # a model call answered, and its calls
            calls = [b["id"] for b in payload["content"] if b["type"] == "tool_use"]
            self.note("model", payload["run_id"], payload["turn"], *calls)

        hooks: dict[str, Any] = {
            "turn:after": turn_after,
            "tool:before": tool_before,
            "tool:after": tool_after,
        }

        def spawn_start(payload: dict[str, Any]) -> None:
            for name, fn in hooks.items():  # sub-agents' calls are counted too, at every depth
                payload["hooks"].setdefault(name, []).append(fn)

        hooks["spawn:start"] = spawn_start
        return hooks

    def answer(self, db_path: str, approve: bool, human: str | None) -> None:
        """Answer the run's waiting calls: approvals (and requests for more budget) with an
        approval, `ask_human` calls with `human` (JSON, when given)."""
        db = Database(db_path)
        try:
            book = AnswerBook(db)
            for call in book.waiting(RUN_ID):
                if call.kind == "approval" and approve:
                    value: Any = {"approved": True, "by": "crashtest"}
                elif call.kind == "ask_human" and human is not None:
                    value = json.loads(human)
                else:
                    continue
                self.note("answer", call.tool, call.call_id)
                book.answer(RUN_ID, call.call_key, value)
        finally:
            db.close()


def child_main(argv: list[str] | None = None) -> int:
    from .cli import USER_ERRORS, build_parser  # cli imports this module when asked for it
    from .hardening import make_undumpable
    from .redact import install as install_redaction

    make_undumpable()  # as `tether run`
    install_redaction()
    parser = argparse.ArgumentParser(prog="python -m tether.programs.crashtest")
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--kill-after-commit", type=int)
    parser.add_argument("--kill-in-call", metavar="RUN/CALL")
    parser.add_argument("--approve", action="store_true")
    parser.add_argument("--human-answer", metavar="JSON")
    own, rest = parser.parse_known_args(argv)
    args = build_parser().parse_args(["run", *rest])
    recorder = Recorder(own.events, own.kill_after_commit, own.kill_in_call)
    Database.committed = recorder.committed
    try:
        code = run_command(args, dict(os.environ), hooks=recorder.hooks(), wrap_tool=recorder.wrap)
    except USER_ERRORS as error:
        print(f"tether: {error}", file=sys.stderr)
        return 2
    if code == PARKED_EXIT:
        recorder.answer(args.db, own.approve, own.human_answer)
    return code


# The driver ----------------------------------------------------------------------------------


class CrashtestError(ConfigError):
    """The agent cannot be crash-tested as it is (no scripted model, runs that differ), or the
    crash test cannot run as asked."""


@dataclass
class Events:
    """What the processes of one run did, read back from their events file."""

    commits: int = 0
    models: Counter[tuple[str, str]] = field(default_factory=Counter)
    calls: set[tuple[str, str]] = field(default_factory=set)  # (run, call) the models made
    bodies: Counter[tuple[str, str]] = field(default_factory=Counter)
    tools: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # name, replay
    after_commit: dict[int, str] = field(default_factory=dict)  # the first event after each
    cut: set[tuple[str, str]] = field(default_factory=set)  # reported as interrupted
    killed: bool = False
    journaled_before_kill: set[str] = field(default_factory=set)  # step names

    @classmethod
    def read(cls, path: Path) -> Events:
        events = cls()
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines:
            kind, *words = line.split(" ")
            if kind == "kill":
                events.killed = True
            elif kind == "commit":
                events.commits = int(words[0])
                if not events.killed:
                    events.journaled_before_kill.update(words[1:])
            elif kind == "model":
                events.models[(words[0], words[1])] += 1
                events.calls.update((words[0], call) for call in words[2:])
                events.after_commit.setdefault(events.commits, f"model call {int(words[1]) + 1}")
            elif kind == "tool":
                run, call, name, replay = words
                events.bodies[(run, call)] += 1
                events.tools[(run, call)] = (name, replay)
                events.after_commit.setdefault(events.commits, f"{name} [{call}]")
            elif kind == "cut":
                events.cut.add((words[0], words[1]))
            elif kind == "answer":
                answer = f"the answer to {words[0]} [{words[1]}]"
                events.after_commit.setdefault(events.commits, answer)
        return events

    def journaled(self, call: str) -> bool:
        """Whether the result of a call `call` was journaled before the kill (step names carry
        no run: with ids that repeat in sub-agents, ask only of ids that do not)."""
        return bool({f"tool:{call}", f"approved:{call}"} & self.journaled_before_kill)

    def unique_calls(self) -> set[str]:
        """The ids of calls that no other run of the tree has."""
        return {call for call, n in Counter(c for _, c in self.calls).items() if n == 1}


Transcript = list[tuple[str, Any]]


@dataclass
class Outcome:
    """A run as it ended: its status, its transcript and the files it left."""

    status: str | None
    transcript: Transcript  # the run's session (`tether run` keeps no sub-agent's)
    files: dict[str, bytes]


@dataclass
class Ran:
    """What became of one run: whether the kill came, its last start, the outcome, and
    whether it was stopped at `MAX_STARTS`."""

    killed: bool
    last: subprocess.CompletedProcess[str]
    events: Events
    outcome: Outcome
    exhausted: bool


@dataclass
class Trial:
    """One kill point: where, what went wrong (nothing: it passed) and what is worth saying."""

    kill: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"kill": self.kill, "ok": not self.problems, "problems": self.problems,
                "notes": self.notes}  # fmt: skip


def _outcome(db: Path, workspace: Path) -> Outcome:
    """The run's outcome, its workspace's path written as `WORKSPACE_MARK` (each run has its
    own: a tool that prints `pwd` says the same in every run)."""
    paths = sorted({str(workspace), str(workspace.resolve())}, key=len, reverse=True)

    def marked(data: bytes) -> bytes:
        for path in paths:
            data = data.replace(os.fsencode(path), WORKSPACE_MARK.encode())
        return data

    file = Database(db)
    try:
        rows = file.query(
            "SELECT role, content FROM tether_turns WHERE session_id = ? ORDER BY position",
            (RUN_ID,),  # `tether run`'s session: the run's id
        )
    finally:
        file.close()
    transcript = [(role, json.loads(marked(content.encode()))) for role, content in rows]
    files = {
        str(path.relative_to(workspace)): marked(path.read_bytes())
        for path in sorted(workspace.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }
    return Outcome(run_status(db, RUN_ID), transcript, files)


def _results(transcript: Transcript) -> dict[str, str]:
    """Each tool call's result in `transcript`, as text."""
    return {
        block["tool_use_id"]: json.dumps(block.get("content"))
        for role, content in transcript
        if role == "user" and isinstance(content, list)
        for block in content
        if block.get("type") == "tool_result"
    }


def _cut(reference: Outcome, outcome: Outcome) -> set[str]:
    """The calls reported as interrupted where the clean run had their result."""
    before = _results(reference.transcript)
    return {
        call
        for call, result in _results(outcome.transcript).items()
        if INTERRUPTED_RESULT in result and INTERRUPTED_RESULT not in before.get(call, "")
    }


def _unanswered(transcript: Transcript) -> list[str]:
    """Tool calls not answered exactly once, in the turn after theirs."""
    wrong = []
    for i, (role, content) in enumerate(transcript):
        if role != "assistant" or not isinstance(content, list):
            continue
        calls = [b["id"] for b in content if b.get("type") == "tool_use"]
        after = transcript[i + 1][1] if i + 1 < len(transcript) else []
        answers = Counter(
            b["tool_use_id"]
            for b in (after if isinstance(after, list) else [])
            if b.get("type") == "tool_result"
        )
        wrong += [call for call in calls if answers[call] != 1]
    return wrong


def _first_difference(a: Transcript, b: Transcript, cut: set[str]) -> str:
    """Where transcript `b` departs from `a`, results of the calls in `cut` aside ("" if never)."""

    def plain(content: Any) -> Any:
        if not isinstance(content, list):
            return content
        return [
            dict(block, content=None, is_error=None)
            if block.get("type") == "tool_result" and block.get("tool_use_id") in cut
            else block
            for block in content
        ]

    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x[0] != y[0] or plain(x[1]) != plain(y[1]):
            return f"turn {i + 1} ({y[0]}) differs: {json.dumps(y[1])[:160]}"
    if len(a) != len(b):
        return f"{len(b)} turns, against {len(a)}"
    return ""


def _changed_files(a: Outcome, b: Outcome) -> list[str]:
    names = set(a.files) | set(b.files)
    return sorted(name for name in names if a.files.get(name) != b.files.get(name))


class Crashtest:
    """The trials of one agent: a template workspace, a prompt, a scratch directory."""

    def __init__(
        self,
        spec: Path,
        prompt: str,
        workspace: Path,
        scratch: Path,
        *,
        script: Path | None,
        answers: list[str],
        env: Mapping[str, str],
    ) -> None:
        self.spec, self.prompt, self.template, self.scratch = spec, prompt, workspace, scratch
        self.script, self.answers = script, answers
        model = load_agent(spec).spec.model
        if model.provider == "scripted":
            real = [f"{path} ({m.label})" for path, m in model.choices() if m.key_variable]
            if real:
                raise CrashtestError(
                    f"crashtest runs every model scripted, so that no kill pays a real one: "
                    f"{spec} has {', '.join(real)}"
                )
        elif not script_file(spec, script).exists():
            raise CrashtestError(
                f"crashtest runs the agent against a scripted model, so that every kill sees the "
                f"same answers and none is paid for: {spec} names {model.label} and there is no "
                f"{script_file(spec, script)}: pass one (--script)"
            )
        keys = {m.key_variable for _, m in model.choices()} | set(DEFAULT_KEY_ENV.values())
        # Without the keys `tether run` takes the script; traces would be sent once per process.
        self.env = {
            k: v for k, v in env.items() if k not in keys and not k.startswith("OTEL_EXPORTER")
        }
        self.env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing written beside the user's modules
        self._running: set[subprocess.Popen[bytes]] = set()
        self._stopping = False
        self._lock = threading.Lock()

    def _command(self, db: Path, workspace: Path, events: Path, *kill: str) -> list[str]:
        # -P: the workspace (the working directory) is not where modules are imported from, as
        # for `tether run`; a file the agent wrote there cannot stand for one.
        command = [sys.executable, "-P", "-m", "tether.programs.crashtest"]
        command += ["--events", str(events), *kill, *self.answers]
        command += [str(self.spec), "--run-id", RUN_ID, "--prompt", self.prompt]
        command += ["--db", str(db), "--workspace", str(workspace), "--quiet"]
        command += ["--script-delay", "0"]
        return command + (["--script", str(self.script)] if self.script else [])

    def _process(self, command: list[str], home: Path) -> subprocess.CompletedProcess[str]:
        """`command` in `home`'s workspace, its output in `home` (no pipe that a process it
        left behind could hold open), its process group killed once it is done."""
        with self._lock, (home / "output").open("ab") as output:
            if self._stopping:
                raise CrashtestError("stopped")
            process = subprocess.Popen(
                command,
                cwd=home / "workspace",  # as `tether run` there: tools' relative paths land there
                env=self.env,
                stdout=output,
                stderr=output,
                start_new_session=True,
            )
            self._running.add(process)
        try:
            process.wait(timeout=CHILD_TIMEOUT_S)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            with self._lock:
                self._running.discard(process)
        said = (home / "output").read_text(errors="replace")[-2000:]
        if timed_out:
            said += f"\ntether crashtest: killed after {CHILD_TIMEOUT_S:.0f} s"
        return subprocess.CompletedProcess(command, process.returncode, "", said)

    def stop(self) -> None:
        """Kill the runs in progress and start none (interrupted)."""
        with self._lock:
            self._stopping = True
            for process in self._running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)

    def run(self, name: str, *kill: str) -> Ran:
        """One run in a fresh copy of the workspace, to its end: started again after the kill
        at `kill` and after every park the child answered."""
        home = self.scratch / name
        workspace, db, events = home / "workspace", home / "runs.db", home / "events"
        shutil.copytree(self.template, workspace, symlinks=True)
        flag, exhausted = list(kill), True
        for _ in range(MAX_STARTS):
            done = self._process(self._command(db, workspace, events, *flag), home)
            if flag and Events.read(events).killed:
                flag = []
            elif done.returncode != PARKED_EXIT or not self.answers or _waiting(db):
                exhausted = False
                break
        killed = bool(kill) and not flag
        return Ran(killed, done, Events.read(events), _outcome(db, workspace), exhausted)

    def reference(self) -> Ran:
        ran = self.run("clean-1")
        if ran.exhausted:
            raise CrashtestError(f"the run without a crash did not end in {MAX_STARTS} starts")
        if ran.outcome.status is None or ran.last.returncode not in (0, 1, PARKED_EXIT):
            raise CrashtestError(f"the run without a crash failed:\n{ran.last.stderr.strip()}")
        again = self.run("clean-2")
        differs = _first_difference(ran.outcome.transcript, again.outcome.transcript, set())
        what = [differs] if differs else []
        files = _changed_files(ran.outcome, again.outcome)
        if files:
            what.append(f"files {files}")
        if again.events.commits != ran.events.commits:
            what.append(f"{ran.events.commits} commits against {again.events.commits}")
        if what:
            raise CrashtestError(
                f"two runs without a crash differ ({'; '.join(what)}): crashtest compares every "
                "crash with a clean run, so the agent must be deterministic: a scripted model, "
                "tools that return and write the same for the same input"
            )
        return ran

    def trial(self, number: int, kill: Kill, ref: Ran) -> Trial:
        trial = Trial(kill.label)
        ran = self.run(f"kill-{number}", *kill.flag)
        events, outcome = ran.events, ran.outcome
        if not ran.killed:
            trial.problems.append(
                f"the run never got there (exit {ran.last.returncode}, {events.commits} commits; "
                f"the clean run made {ref.events.commits}): it does not take the clean run's "
                f"path: {ran.last.stderr.strip()[-400:]}"
            )
            return trial
        if ran.exhausted:
            trial.problems.append(f"the run did not end in {MAX_STARTS} starts")
            return trial
        if ran.last.returncode not in (0, 1, PARKED_EXIT):
            trial.problems.append(f"the resumed run failed (exit {ran.last.returncode}): "
                                  f"{ran.last.stderr.strip()[-400:]}")  # fmt: skip
            return trial
        if outcome.status != ref.outcome.status:
            trial.problems.append(
                f"the run ended {outcome.status}, the clean run {ref.outcome.status}"
            )
        again = +(events.models - ref.events.models)
        if again:
            trial.problems.append(f"{again.total()} model call(s) made again after their answer "
                                  "was journaled (paid twice)")  # fmt: skip
        once = ref.events.unique_calls()
        cut = sorted({call for _, call in events.cut})
        lost = [call for call in cut if call in once and events.journaled(call)]
        if lost:
            trial.problems.append(f"reported as interrupted though their results were journaled "
                                  f"before the kill (lost): {lost}")  # fmt: skip
        reran = []
        for (run, call), count in sorted(events.bodies.items()):
            name, replay = events.tools[(run, call)]
            if count > 1 and replay == "unsafe":
                trial.problems.append(f"{name} [{call}] (replay: unsafe) ran {count} times")
            elif count > 1 and call in once and events.journaled(call):
                trial.problems.append(f"{name} [{call}] ran again though its result was "
                                      "journaled before the kill")  # fmt: skip
            elif count > 1:
                reran.append(f"{name} [{call}]")
        unanswered = _unanswered(outcome.transcript)
        if unanswered != _unanswered(ref.outcome.transcript):  # a parked run waits on its last
            trial.problems.append(f"tool calls not answered exactly once: {unanswered}")
        if cut:
            trial.notes.append(f"reported to the model as interrupted: {cut}")
        if reran:
            trial.notes.append(f"ran again (replay: safe): {reran}")
        why = (
            f" after {reran} ran again: a replay: safe tool must be safe to run twice"
            if reran
            else ""
        )
        differs = _first_difference(
            ref.outcome.transcript, outcome.transcript, _cut(ref.outcome, outcome)
        )
        if differs:
            trial.problems.append(f"the transcript is not the clean run's: {differs}{why}")
        files = _changed_files(ref.outcome, outcome)
        # A cut call's effect may or may not have happened; one killed inside happened whole.
        unknown = events.cut - {kill.call}
        if files and unknown:
            trial.notes.append(f"files unlike the clean run's, after a cut call: {files}")
        elif files:
            trial.problems.append(f"files unlike the clean run's: {files}{why}")
        return trial

    def kills(self, ref: Ran, most_commits: int | None) -> list[Kill]:
        """After each commit (at most `most_commits` of them, spread evenly), and inside each
        tool call."""
        events = ref.events
        commits = list(range(1, events.commits + 1))
        if most_commits is not None and len(commits) > most_commits:
            step = (len(commits) - 1) / max(1, most_commits - 1)
            commits = sorted({commits[round(i * step)] for i in range(most_commits)})
        found = []
        for n in commits:
            before = events.after_commit.get(n)
            where = f"after commit {n}" + (f", before {before}" if before else "")
            found.append(Kill(where, ["--kill-after-commit", str(n)]))
        ids = Counter(call for _, call in events.tools)
        for (run, call), (name, _) in events.tools.items():
            of = f" of run {run[:8]}" if ids[call] > 1 else ""
            flag = ["--kill-in-call", f"{run}/{call}"]
            found.append(Kill(f"inside {name} [{call}]{of}", flag, (run, call)))
        return found


@dataclass(frozen=True)
class Kill:
    label: str
    flag: list[str]
    call: tuple[str, str] | None = None  # the (run, call) killed inside


def _waiting(db: Path) -> bool:
    """Whether a call of the run waits for a person (one the child did not answer)."""
    file = Database(db)
    try:
        return bool(AnswerBook(file).waiting(RUN_ID))
    finally:
        file.close()


@dataclass
class CrashReport:
    """What `crash_test` found: how the clean run ended and one trial per kill point."""

    status: str | None
    commits: int
    model_calls: int
    tool_calls: int
    trials: list[Trial]

    @property
    def failed(self) -> list[Trial]:
        return [trial for trial in self.trials if trial.problems]

    def describe(self) -> str:
        lines = [
            f"the clean run: {self.status}, {self.model_calls} model calls, {self.tool_calls} "
            f"tool calls, {self.commits} commits"
        ]
        for trial in self.trials:
            mark = "FAILED" if trial.problems else "ok"
            lines.append(f"  {trial.kill}: {mark}" + "".join(f"; {n}" for n in trial.notes))
            lines += [f"    - {problem}" for problem in trial.problems]
        failed = len(self.failed)
        lines.append(f"{len(self.trials)} kills: {len(self.trials) - failed} ok, {failed} failed")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "commits": self.commits, "model_calls": self.model_calls,
                "tool_calls": self.tool_calls,
                "trials": [t.to_json() for t in self.trials]}  # fmt: skip


def _scratch(workspace: Path, keep: str | Path | None) -> Path:
    """Where the runs go: `keep` (new or empty) or a temporary directory, never inside the
    workspace (each run's copy would copy the ones before)."""
    if not workspace.is_dir():
        raise CrashtestError(f"the workspace {workspace} is not a directory")
    # Resolved: the runs start in their workspaces, where a relative path means another place.
    scratch = Path(keep or tempfile.mkdtemp(prefix="tether-crashtest-")).resolve()
    if scratch.is_relative_to(workspace.resolve()):
        if not keep:
            scratch.rmdir()
        raise CrashtestError(
            f"{scratch} is inside the workspace {workspace}: every run copies the workspace, so "
            "the runs' directory must be elsewhere (--keep, or TMPDIR)"
        )
    if keep and scratch.exists() and any(scratch.iterdir()):
        raise CrashtestError(f"--keep {scratch} is not empty")
    scratch.mkdir(parents=True, exist_ok=True)
    return scratch


def crash_test(
    spec: str | Path,
    prompt: str,
    *,
    workspace: str | Path = ".",
    script: str | Path | None = None,
    approve: bool = False,
    human_answer: Any = None,
    max_kills: int | None = None,
    jobs: int | None = None,
    keep: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> CrashReport:
    """Kill the run of the agent of `spec` after each commit (at most `max_kills` of them,
    spread evenly) and inside each tool call, `jobs` runs at once in copies of `workspace`, and
    report each (see the module). `approve` approves every call that waits for approval,
    `human_answer` (any JSON value) answers every `ask_human` call; without them a parked run
    ends there, compared parked. Raises `CrashtestError` when the agent cannot be compared so."""
    if max_kills is not None and max_kills < 0:
        raise CrashtestError(f"max_kills is a number of kill points, not {max_kills}")
    answers = ["--approve"] if approve else []
    if human_answer is not None:
        answers += ["--human-answer", json.dumps(human_answer)]
    scratch = _scratch(Path(workspace), keep)
    try:
        test = Crashtest(
            Path(spec).resolve(),  # the runs start in copies of the workspace
            prompt,
            Path(workspace),
            scratch,
            script=Path(script).resolve() if script else None,
            answers=answers,
            env=os.environ if env is None else env,
        )
        say(f"crashtest {spec}: two runs without a crash ...")
        ref = test.reference()
        kills = test.kills(ref, max_kills)
        jobs = jobs or os.cpu_count() or 1
        say(f"  both {ref.outcome.status}; killing it at {len(kills)} points, {jobs} at a time ...")
        pool = concurrent.futures.ThreadPoolExecutor(jobs)
        try:
            trials = list(
                pool.map(lambda n, kill: test.trial(n, kill, ref), range(len(kills)), kills)
            )
        except BaseException:  # Ctrl-C: no trial after this one, none left running
            pool.shutdown(wait=False, cancel_futures=True)
            test.stop()
            raise
        pool.shutdown()
        return CrashReport(
            ref.outcome.status,
            ref.events.commits,
            ref.events.models.total(),
            len(ref.events.calls),
            trials,
        )
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)


def crashtest_command(args: argparse.Namespace) -> int:
    """`tether crashtest`: exits 1 if a kill point failed."""
    try:
        human = None if args.human_answer is None else json.loads(args.human_answer)
    except ValueError:
        raise CrashtestError(f"--human-answer is not JSON: {args.human_answer!r}") from None
    report = crash_test(
        args.spec,
        args.prompt,
        workspace=args.workspace,
        script=args.script,
        approve=args.approve,
        human_answer=human,
        max_kills=args.max_kills,
        jobs=args.jobs,
        keep=args.keep,
        say=(lambda line: None) if args.json else (lambda line: print(line, flush=True)),
    )
    print(json.dumps(report.to_json()) if args.json else report.describe(), flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(child_main())
