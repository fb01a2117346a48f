"""The driver of a crash test: the clean runs, one trial per kill point, the report."""

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._sqlite import Database
from ...durable.answers import AnswerBook
from ...errors import ConfigError
from ...spec import DEFAULT_KEY_ENV, load_agent
from ..run import PARKED_EXIT, script_file
from .events import RUN_ID, Events
from .outcome import Outcome, changed_files, cut_calls, first_difference, outcome_of, unanswered

CHILD_TIMEOUT_S = 300.0

MAX_STARTS = 100
"""Of one run: its kills, then its parks answered (each a start)."""


class CrashtestError(ConfigError):
    """The agent cannot be crash-tested as it is (no scripted model, runs that differ), or the
    crash test cannot run as asked."""


@dataclass
class Ran:
    """What became of one run: its last start, what its processes did, the outcome, and
    whether it was stopped at `MAX_STARTS`."""

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

    def describe(self) -> list[str]:
        mark = "FAILED" if self.problems else "ok"
        return [f"{self.kill}: {mark}" + "".join(f"; {n}" for n in self.notes)] + [
            f"  - {problem}" for problem in self.problems
        ]

    def to_json(self) -> dict[str, Any]:
        return {"kill": self.kill, "ok": not self.problems, "problems": self.problems,
                "notes": self.notes}  # fmt: skip


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

    def run(self, name: str, *kill: str, again: bool = False) -> Ran:
        """One run in a fresh copy of the workspace, to its end: started again after the kill
        at `kill` (`again`: and after a second, after the next step journaled after it) and
        after every park the child answered."""
        home = self.scratch / name
        workspace, db, path = home / "workspace", home / "runs.db", home / "events"
        shutil.copytree(self.template, workspace, symlinks=True)
        flag, kills, exhausted = list(kill), 0, True
        for _ in range(MAX_STARTS):
            done = self._process(self._command(db, workspace, path, *flag), home)
            events = Events.read(path)
            if flag and events.kills > kills:
                kills = events.kills
                flag = ["--kill-after-step"] if again and kills == 1 else []
            elif done.returncode != PARKED_EXIT or not self.answers or _waiting(db):
                exhausted = False
                break
        return Ran(done, events, outcome_of(db, workspace), exhausted)

    def reference(self) -> Ran:
        ran = self.run("clean-1")
        if ran.exhausted:
            raise CrashtestError(f"the run without a crash did not end in {MAX_STARTS} starts")
        if ran.outcome.status is None or ran.last.returncode not in (0, 1, PARKED_EXIT):
            raise CrashtestError(f"the run without a crash failed:\n{ran.last.stderr.strip()}")
        again = self.run("clean-2")
        differs = first_difference(ran.outcome.transcript, again.outcome.transcript, set())
        what = [differs] if differs else []
        files = changed_files(ran.outcome, again.outcome)
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
        ran = self.run(f"kill-{number}", *kill.flag, again=kill.again)
        events, outcome = ran.events, ran.outcome
        if not events.kills:
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
        lost = sorted({call for _, call in events.lost if call in once})
        if lost:
            trial.problems.append(f"reported as interrupted though their results were journaled "
                                  f"before the kill (lost): {lost}")  # fmt: skip
        reran = []
        for (run, call), count in sorted(events.bodies.items()):
            name, replay = events.tools[(run, call)]
            if count > 1 and replay == "unsafe":
                trial.problems.append(f"{name} [{call}] (replay: unsafe) ran {count} times")
            elif call in once and (run, call) in events.ran_after_result:
                trial.problems.append(f"{name} [{call}] ran again though its result was "
                                      "journaled before the kill")  # fmt: skip
            elif count > 1:
                reran.append(f"{name} [{call}]")
        wrong = unanswered(outcome.transcript)
        if wrong != unanswered(ref.outcome.transcript):  # a parked run waits on its last
            trial.problems.append(f"tool calls not answered exactly once: {wrong}")
        if kill.again and events.kills < 2:
            trial.notes.append("no step journaled after the kill: killed once")
        if cut:
            trial.notes.append(f"reported to the model as interrupted: {cut}")
        if reran:
            trial.notes.append(f"ran again (replay: safe): {reran}")
        why = (
            f" after {reran} ran again: a replay: safe tool must be safe to run twice"
            if reran
            else ""
        )
        differs = first_difference(
            ref.outcome.transcript, outcome.transcript, cut_calls(ref.outcome, outcome)
        )
        if differs:
            trial.problems.append(f"the transcript is not the clean run's: {differs}{why}")
        files = changed_files(ref.outcome, outcome)
        # A cut call's effect may or may not have happened; one killed inside happened whole.
        unknown = events.cut - {kill.call}
        if files and unknown:
            trial.notes.append(f"files unlike the clean run's, after a cut call: {files}")
        elif files:
            trial.problems.append(f"files unlike the clean run's: {files}{why}")
        return trial

    def kills(self, ref: Ran, most_commits: int | None, twice: bool) -> list[Kill]:
        """After each commit (at most `most_commits` of them, spread evenly), and inside each
        tool call; `twice`: each of them also with a second kill, after the next step journaled
        after it (by the recovery, or after a park it answered)."""
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
        if twice:
            then = ", then after the next step"
            found += [dataclasses.replace(k, label=k.label + then, again=True) for k in found]
        return found


@dataclass(frozen=True)
class Kill:
    label: str
    flag: list[str]
    call: tuple[str, str] | None = None  # the (run, call) killed inside
    again: bool = False  # killed a second time, after the next step journaled


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

    def describe(self, trials: bool = True) -> str:
        """The clean run, each trial (`trials`; else the failed ones' names) and the count."""
        lines = [
            f"the clean run: {self.status}, {self.model_calls} model calls, {self.tool_calls} "
            f"tool calls, {self.commits} commits"
        ]
        for trial in self.trials if trials else []:
            lines += [f"  {line}" for line in trial.describe()]
        failed = len(self.failed)
        lines.append(f"{len(self.trials)} kills: {len(self.trials) - failed} ok, {failed} failed")
        if failed and not trials:
            lines += [f"  FAILED: {trial.kill}" for trial in self.failed]
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
    twice: bool = False,
    jobs: int | None = None,
    keep: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> CrashReport:
    """Kill the run of the agent of `spec` after each commit (at most `max_kills` of them,
    spread evenly) and inside each tool call (`twice`: each also with a second kill, after the
    next step journaled after it), `jobs` runs at once in copies of `workspace`, and report
    each (see the module); `say` is told of each trial as it ends. `approve` approves every
    call that waits for approval, `human_answer` (any JSON value) answers every `ask_human`
    call; without them a parked run ends there, compared parked. Raises `CrashtestError` when
    the agent cannot be compared so."""
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
        kills = test.kills(ref, max_kills, twice)
        jobs = jobs or os.cpu_count() or 1
        say(f"  both {ref.outcome.status}; killing it at {len(kills)} points, {jobs} at a time ...")
        ended = iter(range(1, len(kills) + 1))
        saying = threading.Lock()  # the trials end in the pool's threads

        def trial(number: int, kill: Kill) -> Trial:
            done = test.trial(number, kill, ref)
            first, *problems = done.describe()
            with saying:
                say(f"  [{next(ended)}/{len(kills)}] {first}")
                for line in problems:
                    say(f"  {line}")
            return done

        pool = concurrent.futures.ThreadPoolExecutor(jobs)
        try:
            trials = list(pool.map(trial, range(len(kills)), kills))
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
        twice=args.twice,
        jobs=args.jobs,
        keep=args.keep,
        say=(lambda line: None) if args.json else (lambda line: print(line, flush=True)),
    )
    # Each trial was said as it ended.
    print(json.dumps(report.to_json()) if args.json else report.describe(False), flush=True)
    return 1 if report.failed else 0
