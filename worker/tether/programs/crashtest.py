"""`tether crashtest`: kill an agent's run at every journal boundary and inside every tool call,
resume it, and check that nothing was lost or done twice.

The agent runs as `tether run` runs it (the embedded SQLite runtime), against its scripted
model, in a copy of the workspace; API keys are dropped from its environment, so no kill ever
pays a real model. First two runs without a crash: they must agree, or the agent is not
deterministic enough to compare against (a tool that returns the time, a script that depends on
something else). Then one trial per kill point, each in a fresh copy of the workspace and a file
of its own:

- after each commit of the run's SQLite file (a step boundary, a person's answer included),
  the process group is SIGKILLed from inside, right after the commit;
- inside each tool call, after its body returned and before its result is journaled: the
  moment a crash makes the outcome unknown.

The same command then starts the run again until it ends (a park the child answered, with
`approve` or `human_answer`, is started again too; one it did not ends the run, parked).

Each resumed run must end as the clean one did, with no model call made again once its answer
was journaled, no `replay: unsafe` tool body run twice, every tool call answered exactly once,
and the same transcript and workspace files as the clean run's, except where a call the crash
cut off was reported to the model as interrupted. A `replay: safe` tool that runs again must
leave the same transcript and files: that is what `safe` promises, and where it does not, the
trial fails naming the tool.

The child processes (`python -m tether.programs.crashtest`) are `tether run` with a recorder:
its hooks and a commit counter append one line per event to a file of the trial's (fsynced, so
a SIGKILL loses none of them).
"""

from __future__ import annotations

import argparse
import asyncio
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
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from .._sqlite import Database
from ..durable import run_status
from ..durable.answers import AnswerBook
from ..session import INTERRUPTED_RESULT, load_session
from ..session.sqlite import sqlite_store
from ..spec import DEFAULT_KEY_ENV, SpecError, load_agent
from ..tools.base import ToolContext, ToolDef, ToolOutput
from .run import PARKED_EXIT, run_command

RUN_ID = "crashtest"
Process = subprocess.CompletedProcess[str]
CHILD_TIMEOUT_S = 300.0
MAX_STARTS = 100
"""Of one run: its kill, then its parks answered (each a start)."""


# The child: `tether run` with a recorder -------------------------------------------------------


class Recorder:
    """Appends what the run does to `path`, one fsynced line per event, and kills the process
    group at the trial's kill point. Commits are counted across the run's processes (a run
    resumed after a park goes on counting), so a kill point names one moment of the run."""

    def __init__(self, path: Path, kill_after_commit: int | None, kill_in_call: str | None):
        self.path = path
        self.kill_after_commit = kill_after_commit
        self.kill_in_call = kill_in_call  # RUN/CALL
        self.commits = Events.read(path).commits
        self.wrapped: set[str] = set()  # tools whose bodies `wrap` counts

    def note(self, *words: object) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (" ".join(map(str, words)) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def die_in(self, run_id: str, call_id: str) -> None:
        if f"{run_id}/{call_id}" == self.kill_in_call:
            os.killpg(0, signal.SIGKILL)  # the whole group, as a pod dies: tools' processes too

    def count_commits(self) -> None:
        commit = Database.execute_commit
        recorder = self

        def counted(db: Database, writes: Any = ()) -> None:
            empty = not (db._staged or writes)  # nothing to commit: no boundary
            commit(db, writes)
            if not empty:
                recorder.commits += 1
                recorder.note("commit", recorder.commits)
                if recorder.commits == recorder.kill_after_commit:
                    os.killpg(0, signal.SIGKILL)

        Database.execute_commit = counted  # type: ignore[method-assign,assignment]

    def wrap(self, tool: ToolDef) -> ToolDef:
        """A built-in or `python` tool whose body is counted as it starts, and killed in as it
        ends (an approval gate's too, whose hooks fire on replays)."""
        self.wrapped.add(tool.name)
        execute, uses_context = tool.execute, tool.uses_context

        async def counted(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
            self.note("tool", ctx.run_id, ctx.call_id, tool.name, tool.replay)
            try:
                return await execute(arguments, ctx if uses_context else cast(ToolContext, None))
            finally:
                self.die_in(ctx.run_id, ctx.call_id)

        return dataclasses.replace(tool, execute=counted, uses_context=True)

    def hooks(self) -> dict[str, Any]:
        def tool_before(payload: dict[str, Any]) -> None:
            # An MCP tool's call (a self-journaled one's hook fires on replays too: not counted).
            if payload["name"] not in self.wrapped and not payload.get("self_journaled"):
                self.note("tool", payload["run_id"], payload["call_id"], payload["name"],
                          payload.get("replay", "unsafe"))  # fmt: skip

        def tool_after(payload: dict[str, Any]) -> None:
            if payload["outcome"] == "interrupted" or INTERRUPTED_RESULT in str(payload["result"]):
                self.note("cut", payload["run_id"], payload["call_id"])  # a crash cut it off
            if payload["name"] not in self.wrapped and not payload.get("self_journaled"):
                self.die_in(payload["run_id"], payload["call_id"])

        def spawn_start(payload: dict[str, Any]) -> None:
            for name, fn in hooks.items():  # sub-agents' calls are counted too, at every depth
                payload["hooks"].setdefault(name, []).append(fn)

        hooks: dict[str, Any] = {
            "turn:after": lambda payload: self.note("model", payload["run_id"], payload["turn"]),
            "tool:before": tool_before,
            "tool:after": tool_after,
            "spawn:start": spawn_start,
        }
        return hooks

    def answer(self, db_path: str, approve: bool, human: Any) -> None:
        """Answer the run's waiting calls: approvals (and requests for more budget) with an
        approval, `ask_human` calls with `human` (when given)."""
        db = Database(db_path)
        try:
            book = AnswerBook(db)
            for call in book.waiting(RUN_ID):
                if call.kind == "approval" and approve:
                    value = {"approved": True, "by": "crashtest"}
                elif call.kind == "ask_human" and human is not None:
                    value = human
                else:
                    continue
                self.note("answer", call.tool, call.call_id)
                book.answer(RUN_ID, call.call_key, value)
        finally:
            db.close()


def child_main(argv: list[str] | None = None) -> int:
    from .cli import USER_ERRORS, build_parser  # cli imports this module when asked for it

    parser = argparse.ArgumentParser(prog="python -m tether.programs.crashtest")
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--kill-after-commit", type=int)
    parser.add_argument("--kill-in-call", metavar="RUN/CALL")
    parser.add_argument("--approve", action="store_true")
    parser.add_argument("--human-answer", type=json.loads)
    own, rest = parser.parse_known_args(argv)
    args = build_parser().parse_args(["run", *rest])
    recorder = Recorder(own.events, own.kill_after_commit, own.kill_in_call)
    recorder.count_commits()
    try:
        code = run_command(args, dict(os.environ), hooks=recorder.hooks(), wrap_tool=recorder.wrap)
    except USER_ERRORS as error:
        print(f"tether: {error}", file=sys.stderr)
        return 2
    if code == PARKED_EXIT:
        recorder.answer(args.db, own.approve, own.human_answer)
    return code


# The driver ----------------------------------------------------------------------------------


class CrashtestError(SpecError):
    """The agent cannot be crash-tested as it is (no scripted model, runs that differ)."""


@dataclass
class Events:
    """What the processes of one run did, read back from their events file."""

    commits: int = 0
    models: Counter[tuple[str, str]] = field(default_factory=Counter)
    bodies: Counter[tuple[str, str]] = field(default_factory=Counter)
    tools: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # name, replay
    cut: set[str] = field(default_factory=set)  # calls reported to the model as interrupted
    after_commit: dict[int, str] = field(default_factory=dict)  # the first event after each

    @classmethod
    def read(cls, path: Path) -> Events:
        events = cls()
        lines = path.read_text().splitlines() if path.exists() else []
        last_commit = 0
        for line in lines:
            kind, *words = line.split(" ")
            if kind == "commit":
                events.commits = last_commit = int(words[0])
            elif kind == "model":
                events.models[(words[0], words[1])] += 1
                events.after_commit.setdefault(last_commit, f"model call {int(words[1]) + 1}")
            elif kind == "tool":
                run, call, name, replay = words
                events.bodies[(run, call)] += 1
                events.tools[(run, call)] = (name, replay)
                events.after_commit.setdefault(last_commit, f"{name} [{call}]")
            elif kind == "cut":
                events.cut.add(words[1])
            elif kind == "answer":
                events.after_commit.setdefault(
                    last_commit, f"the answer to {words[0]} [{words[1]}]"
                )
        return events


@dataclass
class Outcome:
    """A run as it ended: its status, its transcript and the files it left."""

    status: str | None
    transcript: list[tuple[str, Any]]
    files: dict[str, bytes]


@dataclass
class Trial:
    """One kill point: where, what went wrong (nothing: it passed) and what is worth saying."""

    kill: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"kill": self.kill, "ok": not self.problems, "problems": self.problems,
                "notes": self.notes}  # fmt: skip


def _waiting(db: Path) -> bool:
    """Whether a call of the run waits for a person (one the child did not answer)."""
    book = Database(db)
    try:
        return bool(AnswerBook(book).waiting(RUN_ID))
    finally:
        book.close()


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


def _outcome(db: Path, workspace: Path) -> Outcome:
    store = sqlite_store(db)
    try:
        session = asyncio.run(load_session(store, RUN_ID))  # `tether run`'s session: the run's id
    finally:
        store.db.close()
    turns: list[tuple[str, Any]] = [(t.role, t.content) for t in session.turns] if session else []
    return Outcome(run_status(db, RUN_ID), turns, _files(workspace))


def _unanswered(transcript: list[tuple[str, Any]]) -> list[str]:
    """Tool calls not answered exactly once, in the turn after theirs."""
    wrong = []
    for i, (role, content) in enumerate(transcript):
        if role != "assistant" or not isinstance(content, list):
            continue
        calls = [b["id"] for b in content if b.get("type") == "tool_use"]
        if not calls:
            continue
        after = transcript[i + 1][1] if i + 1 < len(transcript) else []
        answers = Counter(
            b["tool_use_id"]
            for b in (after if isinstance(after, list) else [])
            if b.get("type") == "tool_result"
        )
        wrong += [call for call in calls if answers[call] != 1]
    return wrong


def _first_difference(a: list[tuple[str, Any]], b: list[tuple[str, Any]], cut: set[str]) -> str:
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
        if (
            model.provider != "scripted"
            and not (script or spec.with_suffix(".script.yaml")).exists()
        ):
            raise CrashtestError(
                f"crashtest runs the agent against a scripted model, so that every kill sees the "
                f"same answers and none is paid for: {spec} names {model.label} and there is no "
                f"{script or spec.with_suffix('.script.yaml')}: pass one (--script)"
            )
        secret = {model.api_key_env, *DEFAULT_KEY_ENV.values()}
        # Without the keys `tether run` takes the script; traces would be sent once per process.
        self.env = {
            k: v for k, v in env.items() if k not in secret and not k.startswith("OTEL_EXPORTER")
        }

    def _command(self, db: Path, workspace: Path, events: Path, *kill: str) -> list[str]:
        command = [sys.executable, "-m", "tether.programs.crashtest", "--events", str(events)]
        command += [*kill, *self.answers]
        command += [str(self.spec), "--run-id", RUN_ID, "--prompt", self.prompt]
        command += ["--db", str(db), "--workspace", str(workspace), "--quiet"]
        command += ["--script-delay", "0"]
        return command + (["--script", str(self.script)] if self.script else [])

    def _process(self, command: list[str], workspace: Path) -> Process:
        process = subprocess.Popen(
            command,
            cwd=workspace,  # as `tether run` in the workspace: tools' relative paths land there
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = process.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            err += f"\ntether crashtest: killed after {CHILD_TIMEOUT_S:.0f} s"
        finally:  # what the run started outlives it in its group only until here
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return subprocess.CompletedProcess(command, process.returncode, out, err)

    def run(self, name: str, *kill: str) -> tuple[bool, Process, Events, Outcome]:
        """One run in a fresh copy of the workspace, to its end: started again after the kill
        at `kill` (and whether it came) and after every park the child answered."""
        home = self.scratch / name
        workspace, db, events = home / "workspace", home / "runs.db", home / "events"
        shutil.copytree(self.template, workspace, symlinks=True)
        killed, flag = False, list(kill)
        for _ in range(MAX_STARTS):
            done = self._process(self._command(db, workspace, events, *flag), workspace)
            if flag and done.returncode == -signal.SIGKILL:
                killed, flag = True, []
            elif done.returncode != PARKED_EXIT or not self.answers or _waiting(db):
                break
        return killed, done, Events.read(events), _outcome(db, workspace)

    def reference(self) -> tuple[Events, Outcome]:
        _, done, events, outcome = self.run("clean-1")
        if outcome.status is None or done.returncode not in (0, 1, 3):
            raise CrashtestError(f"the run without a crash failed:\n{done.stderr.strip()}")
        _, _, again_events, again = self.run("clean-2")
        differs = _first_difference(outcome.transcript, again.transcript, set())
        files = sorted(set(outcome.files.items()) ^ set(again.files.items()))
        if differs or files or again_events.commits != events.commits:
            what = (
                differs
                or (f"files {sorted({f for f, _ in files})}" if files else "")
                or (f"{events.commits} commits against {again_events.commits}")
            )
            raise CrashtestError(
                f"two runs without a crash differ ({what}): crashtest compares every crash with "
                "a clean run, so the agent must be deterministic: a scripted model, tools that "
                "return and write the same for the same input"
            )
        return events, outcome

    def trial(self, number: int, kill: str, flag: list[str], ref: tuple[Events, Outcome]) -> Trial:
        ref_events, ref_outcome = ref
        trial = Trial(kill)
        killed, done, events, outcome = self.run(f"kill-{number}", *flag)
        if not killed:
            trial.problems.append(
                f"the run never got there (exit {done.returncode}, {events.commits} commits; the "
                f"clean run made {ref_events.commits}): it does not take the clean run's path"
            )
            return trial
        if done.returncode not in (0, 1, 3):
            trial.problems.append(f"the resumed run failed (exit {done.returncode}): "
                                  f"{done.stderr.strip()[-400:]}")  # fmt: skip
            return trial
        if outcome.status != ref_outcome.status:
            trial.problems.append(
                f"the run ended {outcome.status}, the clean run {ref_outcome.status}"
            )
        again = +(events.models - ref_events.models)
        if again:
            trial.problems.append(f"{again.total()} model call(s) made again after their answer "
                                  "was journaled (paid twice)")  # fmt: skip
        cut = events.cut
        reran = []
        for key, count in sorted(events.bodies.items()):
            name, replay = events.tools[key]
            if count > 1 and replay == "unsafe":
                trial.problems.append(f"{name} [{key[1]}] (replay: unsafe) ran {count} times")
            elif count > 1:
                reran.append(f"{name} [{key[1]}]")
        unanswered = _unanswered(outcome.transcript)
        if unanswered != _unanswered(ref_outcome.transcript):  # a parked run waits on its last
            trial.problems.append(f"tool calls not answered exactly once: {unanswered}")
        if cut:
            trial.notes.append(f"reported to the model as interrupted: {sorted(cut)}")
        if reran:
            trial.notes.append(f"ran again (replay: safe): {reran}")
        differs = _first_difference(ref_outcome.transcript, outcome.transcript, cut)
        files = sorted(
            name
            for name in set(ref_outcome.files) | set(outcome.files)
            if ref_outcome.files.get(name) != outcome.files.get(name)
        )
        if files and cut:
            trial.notes.append(f"files unlike the clean run's, after a cut call: {files}")
        why = (
            f" after {reran} ran again: a replay: safe tool must be safe to run twice"
            if reran
            else ""
        )
        if differs:
            trial.problems.append(f"the transcript is not the clean run's: {differs}{why}")
        if files and not cut:
            trial.problems.append(f"files unlike the clean run's: {files}{why}")
        return trial

    def kills(self, events: Events) -> Iterator[tuple[str, list[str]]]:
        for n in range(1, events.commits + 1):
            before = events.after_commit.get(n)
            where = f"after commit {n}" + (f", before {before}" if before else "")
            yield where, ["--kill-after-commit", str(n)]
        for (run, call), (name, _) in events.tools.items():
            yield f"inside {name} [{call}]", ["--kill-in-call", f"{run}/{call}"]


def _spread(items: list[Any], most: int | None) -> list[Any]:
    """At most `most` of `items`, evenly spread, the first and last included."""
    if most is None or len(items) <= most:
        return items
    if most < 2:
        return items[:most]
    return [items[round(i * (len(items) - 1) / (most - 1))] for i in range(most)]


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
        return {"status": self.status, "commits": self.commits,
                "trials": [t.to_json() for t in self.trials]}  # fmt: skip


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
    """Kill the run of the agent of `spec` at every point (at most `max_kills`, spread evenly),
    `jobs` runs at once in copies of `workspace`, and report each (see the module). `approve`
    approves every call that waits for approval, `human_answer` (any JSON value) answers every
    `ask_human` call; without them a parked run ends there, compared parked. Raises
    `CrashtestError` when the agent cannot be compared so."""
    answers = ["--approve"] if approve else []
    if human_answer is not None:
        answers += ["--human-answer", json.dumps(human_answer)]
    scratch = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="tether-crashtest-"))
    scratch.mkdir(parents=True, exist_ok=True)
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
        events, outcome = ref
        kills = _spread(list(test.kills(events)), max_kills)
        jobs = jobs or os.cpu_count() or 1
        say(f"  both {outcome.status}; killing it at {len(kills)} points, {jobs} at a time ...")
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            trials = list(
                pool.map(
                    lambda n, kill: test.trial(n, kill[0], kill[1], ref), range(len(kills)), kills
                )
            )
        return CrashReport(
            outcome.status, events.commits, events.models.total(), events.bodies.total(), trials
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
