"""The events file of a crash test's run: what its processes did, one fsynced line each,
written by the recorder in them and read back by the driver."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

RUN_ID = "crashtest"


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
    kills: int = 0
    # Calls whose result a process found journaled when it started, yet ran again or reported
    # as interrupted (step names carry no run: ask only of ids that no other run has).
    ran_after_result: set[tuple[str, str]] = field(default_factory=set)
    lost: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def read(cls, path: Path) -> Events:
        events = cls()
        lines = path.read_text().splitlines() if path.exists() else []
        journaled: set[str] = set()
        durable: set[str] = set()  # what was journaled when the latest process started
        for line in lines:
            kind, *words = line.split(" ")
            if kind == "start":
                durable = set(journaled)
            elif kind == "kill":
                events.kills += 1
            elif kind == "commit":
                events.commits = int(words[0])
                journaled.update(words[1:])
            elif kind == "model":
                events.models[(words[0], words[1])] += 1
                events.calls.update((words[0], call) for call in words[2:])
                events.after_commit.setdefault(events.commits, f"model call {int(words[1]) + 1}")
            elif kind == "tool":
                run, call, name, replay = words
                events.bodies[(run, call)] += 1
                events.tools[(run, call)] = (name, replay)
                events.after_commit.setdefault(events.commits, f"{name} [{call}]")
                if _result_in(call, durable):
                    events.ran_after_result.add((run, call))
            elif kind == "cut":
                events.cut.add((words[0], words[1]))
                if _result_in(words[1], durable):
                    events.lost.add((words[0], words[1]))
            elif kind == "answer":
                answer = f"the answer to {words[0]} [{words[1]}]"
                events.after_commit.setdefault(events.commits, answer)
        return events

    def unique_calls(self) -> set[str]:
        """The ids of calls that no other run of the tree has."""
        return {call for call, n in Counter(c for _, c in self.calls).items() if n == 1}


def _result_in(call: str, steps: set[str]) -> bool:
    return bool({f"tool:{call}", f"approved:{call}"} & steps)
