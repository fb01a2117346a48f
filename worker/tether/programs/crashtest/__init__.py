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
  moment a crash makes the outcome unknown;
- with `twice`, each of those again with a second kill after the next step journaled after it.

The same command then starts the run again until it ends (a park the child answered, with
`approve` or `human_answer`, is started again too; one it did not ends the run, parked).

Each run must end as the clean one did, with no model call made again once its answer was
journaled, no `replay: unsafe` tool body run twice, no result journaled before the kill lost
(reported as interrupted, or its body run again), every tool call answered exactly once, and
the same transcript and workspace files as the clean run's, except where a call the crash cut
off was reported to the model as interrupted (sub-agents' transcripts are not kept: their calls
are counted and killed in, their turns not compared). A `replay: safe` tool that runs again
must leave the same transcript and files: that is what `safe` promises, and where it does not,
the trial fails naming the tool.

Its parts: `driver` (the runs and their trials), `recorder` (the child processes: `tether run`
with a recorder, `python -m tether.programs.crashtest`), `events` (what the one writes and the
other reads) and `outcome` (what is compared).
"""

from .driver import CrashReport, CrashtestError, Trial, crash_test, crashtest_command

__all__ = ["CrashReport", "CrashtestError", "Trial", "crash_test", "crashtest_command"]
