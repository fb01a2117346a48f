"""`tether run`: one agent run on the embedded SQLite runtime, with progress output.

Calls that wait for a person (`requireApproval`, `ask_human`) stop the run: it exits with
`PARKED_EXIT` and names them; `tether answer` records the answer and the same `tether run`
command resumes the run from its journal (`tether.durable.answers`).

The journal and the answers live in `--db`, which must be outside `--workspace`: inside, the
agent's file tools could rewrite the run's own journal or answer its own calls. By default it
is in Tether's state directory (`tether.programs.hardening.state_dir`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._sqlite import Database
from ..agent import AgentStats, create_agent
from ..agent.hooks import HookFn, HooksInit
from ..agent.spawn import spawn_tool
from ..durable import sqlite_runtime
from ..durable.answers import AnswerBook, Parked, WaitingCall, embedded_wait
from ..durable.protocol import DurableRuntime
from ..parked import asks_for_budget
from ..providers.base import Fallback, Provider
from ..providers.scripted import scripted
from ..providers.spend import SpendGate, SqliteSpendGate
from ..session import Session, SessionStore, create_session, load_session
from ..session.fork import ForkError, fork_session
from ..spec import DEFAULT_KEY_ENV, DurableAgentSpec, SpecError, load_agent, parse_duration
from ..spec.assemble import (
    SPAWN_TOOL,
    api_key_for,
    behavior_from_spec,
    check_subagents,
    cooldown_from_spec,
    fallbacks_from_spec,
    load_script,
    output_from_spec,
    parking_with,
    provider_from_spec,
    spend_caps_of,
    subagents_from_spec,
    tools_from_spec,
)
from ..tools.base import ToolDef
from ..tools.human import Wait
from ..tools.toolset import Toolset
from .hardening import refuse_state_in_workspace
from .trace_context import traces_wanted

DEFAULT_MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4o"}
PARKED_EXIT = 3
"""Exit code of `tether run` when the run stopped to wait for a person."""


def script_file(spec_path: Path, script: str | Path | None) -> Path:
    """The scripted model's file: `script`, or the one beside the manifest."""
    return Path(script) if script else spec_path.with_suffix(".script.yaml")


def choose_provider(
    spec: DurableAgentSpec,
    spec_path: Path,
    script: str | None,
    env: dict[str, str],
    spend: SpendGate | None = None,
    script_delay: float | None = None,
) -> tuple[Provider, list[Fallback], str]:
    """The provider to use, its fallbacks and a line saying why: the spec's models if the
    first one's key is set, else whichever of ANTHROPIC_API_KEY / OPENAI_API_KEY is set, else
    the example's script (its calls `script_delay` seconds long, when given); all held to
    `spend`, the spec's spend caps."""
    key = api_key_for(spec, env)
    if spec.model.provider == "scripted" or key:
        fallbacks = fallbacks_from_spec(spec, env, spend=spend)
        then = "".join(f", then {model.label}" for model in spec.model.fallbacks or [])
        made = provider_from_spec(spec, key or "", spend=spend)
        return made, fallbacks, f"model: {spec.model.label}{then}"
    for provider, variable in DEFAULT_KEY_ENV.items():
        if env.get(variable):
            other = spec.model_copy(
                update={
                    "model": spec.model.model_copy(
                        update={
                            "provider": provider,
                            "name": DEFAULT_MODELS[provider],
                            "api_key_env": variable,
                            "pricing": None,
                        }
                    )
                }
            )
            return (
                provider_from_spec(other, env[variable], spend=spend),
                [],
                f"model: {provider}/{DEFAULT_MODELS[provider]} ({variable} is set)",
            )
    script_path = script_file(spec_path, script)
    if not script_path.exists():
        raise SpecError(
            f"no API key: set {DEFAULT_KEY_ENV[spec.model.provider]} (or the other provider's "
            "key), or pass --script with a scripted model"
        )
    responses, delay = load_script(script_path)
    return (
        scripted(
            responses, model="scripted", delay=delay if script_delay is None else script_delay
        ),
        [],
        f"model: scripted, from {script_path} (no ANTHROPIC_API_KEY or OPENAI_API_KEY is set)",
    )


class Progress:
    """Prints what the run does, as it does it (hooks fire only for live steps)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.turn = 0

    def say(self, line: str) -> None:
        if self.enabled:
            print(line, flush=True)

    def hooks(self) -> HooksInit:
        return {
            "turn:after": self._turn,
            "tool:before": self._tool_before,
            "tool:after": self._tool_after,
            "replay:done": lambda _: self.say("  replay done: continuing live"),
        }

    def _turn(self, payload: dict[str, Any]) -> None:
        self.turn = payload["turn"] + 1
        usage = payload["usage"]
        text = " ".join(b["text"] for b in payload["content"] if b["type"] == "text").strip()
        calls = sum(1 for b in payload["content"] if b["type"] == "tool_use")
        said = f' "{text[:60]}"' if text else ""
        self.say(
            f"[turn {self.turn}] model answered{said}: {calls} tool call(s) "
            f"({usage['input']} in / {usage['output']} out tokens)"
        )

    def _tool_before(self, payload: dict[str, Any]) -> None:
        arguments = ", ".join(f"{k}={v!r}"[:40] for k, v in payload["input"].items())
        self.say(f"  → {payload['name']}({arguments})  [{payload['call_id']}]")

    def _tool_after(self, payload: dict[str, Any]) -> None:
        mark = "✗" if payload["is_error"] else "←"
        result = str(payload["result"]).replace("\n", " ")[:70]
        self.say(f"  {mark} {payload['name']} [{payload['outcome']}]: {result}")


def merge_hooks(*parts: HooksInit) -> dict[str, list[HookFn]]:
    """The hooks of several sources, each hook's functions in their order."""
    merged: dict[str, list[HookFn]] = {}
    for part in parts:
        for name, fns in part.items():
            merged.setdefault(name, []).extend([fns] if callable(fns) else fns)
    return merged


def _describe(counter: Counter[str]) -> str:
    parts = ", ".join(f"{kind} {n}" for kind, n in sorted(counter.items()))
    return f"{counter.total()}" + (f" ({parts})" if parts else "")


def run_command(
    args: argparse.Namespace,
    env: dict[str, str],
    *,
    hooks: HooksInit | None = None,
    wrap_tool: Callable[[ToolDef], ToolDef] | None = None,
) -> int:
    """`tether run`; `hooks` watch the run beside the progress output's and `wrap_tool` wraps
    the spec's tools, MCP servers' included (`tether crashtest`)."""
    spec_path = Path(args.spec)
    manifest = load_agent(spec_path)
    # `python:` tools of an example may sit next to its manifest.
    sys.path.insert(0, str(spec_path.resolve().parent))
    spec = manifest.spec
    caps = spend_caps_of(spec)  # counted in the runs' file, with every run of the agent there
    spend = SqliteSpendGate(args.db, manifest.metadata.name, caps) if caps else None
    provider, fallbacks, provider_note = choose_provider(
        spec, spec_path, args.script, env, spend, args.script_delay
    )
    refuse_state_in_workspace(Path(args.db), Path(args.workspace), "the runs' database", "--db")
    Path(args.db).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    answers = Database(args.db)
    try:
        book = AnswerBook(answers)
        wait = embedded_wait(book, args.run_id, parse_duration(spec.approvals.timeout))
        # Built before the run is opened: a tool the spec gets wrong fails here, touching nothing.
        check_subagents(spec)
        parking = parking_with(wait, spec.approvals.on_timeout)
        tools = tools_from_spec(spec, args.workspace, parking, env=env, wrap=wrap_tool)
        if spec.subagents is not None:  # in-process children, journaled in the run's scopes
            children = spec.subagents
            spawn = spawn_tool(
                name=SPAWN_TOOL,
                max_depth=children.max_depth,
                max_concurrent=children.max_concurrent,
                agents=subagents_from_spec(spec, provider, fallbacks),
            )
            tools.append(spawn)
        progress = Progress(not args.quiet)
        progress.say(f"agent {manifest.metadata.name}, run {args.run_id} in {args.db}")
        progress.say(f"  {provider_note}")
        tracing = None
        if traces_wanted(env):  # OTEL_EXPORTER_OTLP_ENDPOINT...; without, nothing is loaded
            from .tracing import tracing_from_env

            tracing = tracing_from_env(env, service_name=manifest.metadata.name)

        def run_hooks(durable: DurableRuntime) -> dict[str, list[HookFn]]:
            traced: HooksInit = {}
            if tracing is not None:
                traced = tracing.hooks(
                    agent=manifest.metadata.name,
                    provider=provider.name,
                    model=provider.model,
                    durable=durable,
                    attributes={"tether.cli.run_id": args.run_id},
                )
            return merge_hooks(progress.hooks(), traced, hooks or {})

        try:
            models = (provider, fallbacks)
            running = _run(args, spec, models, tools, book, wait, progress, run_hooks)
            return asyncio.run(running)
        finally:
            if tracing is not None:
                tracing.shutdown()  # exports what the run emitted, parked or not
    finally:
        answers.close()


async def _forked(
    args: argparse.Namespace,
    store: SessionStore,
    session_id: str,
    session: Session | None,
    resuming: bool,
) -> Session:
    """`--session` as a fork of `--fork SESSION[:TURNS]` (made at the run's first start; a
    resumed run replays the same loads, so it makes the same one)."""
    source_id, _, count = str(args.fork).partition(":")
    if count and not count.isdigit():
        raise SpecError(f"--fork {args.fork}: TURNS must be a number of turns")
    if session is not None:
        if resuming:
            return session
        raise SpecError(f"session {session_id!r} exists: fork into a new --session")
    source = await load_session(store, source_id)
    if source is None:
        raise SpecError(f"--fork: no session {source_id!r} in {args.db}")
    try:
        return await fork_session(
            source_id,
            source.turns,
            id=session_id,
            store=store,
            count=int(count) if count else None,
        )
    except ForkError as error:
        raise SpecError(f"--fork: {error}") from None


async def _run(
    args: argparse.Namespace,
    spec: DurableAgentSpec,
    models: tuple[Provider, list[Fallback]],
    tools: list[ToolDef | Toolset],
    book: AnswerBook,
    wait: Wait,
    progress: Progress,
    run_hooks: Callable[[DurableRuntime], dict[str, list[HookFn]]],
) -> int:
    with sqlite_runtime(args.db, args.run_id) as durable:
        if durable.resuming:
            progress.say(f"  resuming: {len(durable.journal)} steps are journaled, replaying them")

        async def first_prompt() -> Any:
            return args.prompt

        # The prompt of the first start is journaled; a resume reuses it.
        prompt = await durable.step("decision", "cli:prompt", first_prompt)
        if args.prompt is not None and prompt != args.prompt:
            progress.say("  note: this run started with another --prompt; resuming with that one")
        store = durable.stores.session
        assert store is not None
        session_id = args.session or args.run_id
        session = await load_session(store, session_id)
        if args.fork:
            session = await _forked(args, store, session_id, session, durable.resuming)
        session = session or await create_session(id=session_id, store=store)
        if prompt is None and not session.turn_count:
            raise SpecError("--prompt is required on the first start of a run")
        agent = create_agent(
            provider=models[0],
            fallbacks=models[1],
            cooldown=cooldown_from_spec(spec),
            tools=tools,
            system=spec.system,
            output=output_from_spec(spec),
            durable=durable,
            session=session,
            behavior=behavior_from_spec(spec),
            hooks=run_hooks(durable),
            wait=wait,  # for more budget (`limits.onExhausted: ask`), as the approvals wait
        )
        try:
            stats = await agent.run(prompt)
        except Parked:
            waiting = book.waiting(args.run_id)
            durable.close("parked")
            report_parked(waiting, args, progress)
            return PARKED_EXIT
        durable.close(stats.status)
    report(stats, durable.counters.live, durable.counters.replayed, args, progress)
    return 0 if stats.status == "completed" else 1


def report_parked(waiting: list[WaitingCall], args: argparse.Namespace, progress: Progress) -> None:
    progress.say(f"run {args.run_id}: parked, waiting for a person")
    for call in waiting:
        progress.say(f"  {call.kind}: {call.tool}({call.input_summary})  [{call.call_id}]")
        if asks_for_budget(call.tool, call.call_id):
            progress.say(
                "  (out of budget: --approve raises it by its size; --value "
                '\'{"approved": true, "raise_to": {"cost_usd": ...}}\' names the new budget)'
            )
    progress.say(
        f"  answer with `tether answer {args.run_id} --approve` (or --deny, or --value JSON for "
        "ask_human), then run the same command again to resume"
    )


def report(
    stats: AgentStats,
    live: Counter[str],
    replayed: Counter[str],
    args: argparse.Namespace,
    progress: Progress,
) -> None:
    progress.say(
        f"run {args.run_id}: {stats.status} after {stats.turns} turns and {stats.tool_calls} tool "
        f"calls; {stats.input_tokens} in / {stats.output_tokens} out tokens, "
        f"${stats.total_cost_usd:.4f}"
    )
    progress.say(f"  steps replayed from the journal: {_describe(replayed)}")
    progress.say(f"  steps run live: {_describe(live)}")
    if stats.error:
        progress.say(f"  error: {stats.error}")
    if stats.status == "completed" and stats.text:
        progress.say(f"  final answer: {stats.text}")
    if args.json:
        print(
            json.dumps(
                {"stats": stats.to_json(), "live": dict(live), "replayed": dict(replayed)},
                sort_keys=True,
            ),
            flush=True,
        )
