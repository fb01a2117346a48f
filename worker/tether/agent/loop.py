"""One run of the agent loop.

Per turn: a model step, which first decides whether the turn happens at all (a stop, aborted,
max turns or budget, is journaled in place of the model's answer), then the tool calls as tool
steps. A run with a budget (or a sub-agent of one) reserves each model call's worst case in its
budget's ledger before the step and settles it after (`tether.budget`). Everything that is not
a pure function of the journal goes through the durable runtime, so a replay takes the same path
and calls nothing twice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..budget import BudgetLedger, Limits, Spend, input_bound, usage_tokens, worst_case
from ..durable.journal import now_ms
from ..errors import ConfigError
from ..jsoncodec import dumps
from ..messages import JSON, Message, estimate_tokens, text_block, text_of, tool_uses
from ..parked import BUDGET_TOOL
from ..providers.base import ModelRequest, Provider, ProviderError
from ..providers.spend import SpendCapReached
from ..session.events import EventLog, event
from ..session.session import Session
from ..session.types import SessionRun, SessionTurn
from ..tools.base import ToolContext, ToolDef
from ..tools.human import approval
from ..tools.toolset import Toolset, ToolsetError
from .abort import Aborted, AbortSignal
from .compaction import compact_tail
from .stats import AgentStats, AgentStatus
from .tool_calls import ToolCallExecutor, ToolRun

if TYPE_CHECKING:
    from .agent import Agent
    from .behavior import Behavior
    from .output import Output

logger = logging.getLogger(__name__)

BUDGET_WARNING = 0.8
"""A run's events warn once it has spent this share of a budget."""
STEERING_EVERY_MS = 1000.0
"""How often a run's quick tool turns take the inbox's messages (`AgentRun._steering`)."""
BACKOFF_BASE_MS = 1000.0
BACKOFF_MAX_MS = 30_000.0


def backoff_ms(attempt: int, retry_after: float | None) -> float:
    """Exponential backoff; a server's `retry-after` (seconds) wins."""
    if retry_after is not None:
        return max(0.0, retry_after * 1000)
    return float(min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2**attempt))


def _lister(toolset: Toolset) -> Callable[[], Awaitable[JSON]]:
    async def list_now() -> JSON:
        try:
            return {"listing": await toolset.list_tools()}
        except ToolsetError as error:  # journaled: a replay fails the same way
            return {"error": str(error)}

    return list_now


class AgentRun:
    """The state of one `agent.run` call."""

    def __init__(
        self,
        agent: Agent,
        session: Session,
        behavior: Behavior,
        abort: AbortSignal,
    ) -> None:
        self.agent = agent
        self.durable = agent.durable
        self.session = session
        self.behavior = behavior
        self.abort = abort
        self.stats = AgentStats()
        self.run_id = ""
        self.record: SessionRun | None = None
        self.tool_defs: list[ToolDef] = []
        self._warned: set[str] = set()
        self._steered_at: float | None = None
        """When the inbox was last taken after a turn's tool calls (journaled time, ms)."""
        self._look_first = False
        """The next model step looks at the inbox before it calls the model (`_steering`)."""
        self.limits = Limits(behavior.max_cost_usd, behavior.max_tokens)
        self.ledger: BudgetLedger | None = None
        self.budget_tree: str | None = None
        self._charged = Spend()
        """The worst cases of the run's failed calls the provider may have charged (journaled
        as `charged`): counted by its budget beside what its answered calls spent."""

    # The loop ------------------------------------------------------------------------------

    async def execute(self, prompt: str | None) -> AgentStats:
        try:
            with self.durable.hold_writes():
                return await self._execute(prompt)
        finally:
            await self._close_toolsets()

    async def _execute(self, prompt: str | None) -> AgentStats:
        durable = self.durable
        self.run_id = self.stats.run_id = durable.uuid()
        # A sub-agent reserves from its root's budget; a run with a budget owns one.
        tree = self.agent.budget_tree or (self.run_id if self.limits else None)
        if tree is not None and durable.stores.budget is not None:
            self.ledger, self.budget_tree = durable.stores.budget, tree
        started = await durable.now()
        self.stats.started_at = started
        record = SessionRun(id=self.run_id, status="running", started_at=started, prompt=prompt)
        self.record = record
        await self.session.save_run(record)
        if prompt is not None:
            await self._append("user", [text_block(prompt)], created_at=started)
        await self._publish(event("run_started", self.run_id, started, prompt=prompt))
        status: AgentStatus
        error: str | None
        ended_at: float | None = None
        try:
            self.tool_defs = await self._list_tools()
        except ToolsetError as failure:
            status, error = "error", str(failure)
        else:
            # The executor lives in `_turns` only: held by the run, it would close a reference
            # cycle through the run's own methods it is given, and a run's objects would wait
            # for the cyclic collector instead of going when it ends.
            tools = ToolCallExecutor(
                ToolRun(
                    agent=self.agent,
                    tools=self.tool_defs,
                    durable=durable,
                    behavior=self.behavior,
                    abort=self.abort,
                    stats=self.stats,
                    run_id=self.run_id,
                    session_id=self.session.id,
                    record_decision=self.record_decision,
                    live=self._live,
                    budget_tree=self.budget_tree,
                )
            )
            status, error, ended_at = await self._turns(tools)
        self.stats.status = status
        self.stats.error = error
        if ended_at is None:  # no model step said when the run stopped: a step of its own
            ended = await durable.step("decision", "run:end", lambda: self._value({}))
            ended_at = ended["at"]
        self.stats.ended_at = ended_at
        if self.ledger is not None and self.agent.budget_tree is None:
            await self.ledger.close(self.run_id)  # the root's: its tree is done
        record.status = status
        record.ended_at = self.stats.ended_at
        record.stats = self.stats.to_json()
        await self.session.save_run(record)
        stats = self.stats
        await self._publish(
            event(
                "run_ended",
                self.run_id,
                ended_at,
                status=status,
                error=error,
                turns=stats.turns,
                tool_calls=stats.tool_calls,
                tokens=stats.total_tokens,
                cost_usd=stats.total_cost_usd,
                **({} if stats.output is None else {"output": stats.output}),
            )
        )
        return self.stats

    async def _list_tools(self) -> list[ToolDef]:
        """The run's tools: the agent's own, and each toolset's from a listing journaled now,
        so a replay has the tools the run started with."""
        tools = [t for t in self.agent.tools if isinstance(t, ToolDef)]
        if self.agent.output is not None:
            tools.append(self.agent.output.tool)
        for toolset in self._toolsets():
            listing = await self.durable.step(
                "decision", f"toolset:{toolset.name}", _lister(toolset)
            )
            if "error" in listing:
                raise ToolsetError(listing["error"])
            tools.extend(toolset.tools(listing["listing"]))
        names = [t.name for t in tools]
        if clashes := sorted({n for n in names if names.count(n) > 1}):
            raise ToolsetError(
                f"tool names listed twice: {', '.join(clashes)}; give a toolset a prefix or "
                "exclude the tool from it"
            )
        return tools

    def _toolsets(self) -> list[Toolset]:
        return [t for t in self.agent.tools if not isinstance(t, ToolDef)]

    async def _close_toolsets(self) -> None:
        for toolset in self._toolsets():
            try:
                await toolset.aclose()
            except Exception:  # a connection that fails to close must not fail the run
                logger.warning("closing toolset %s failed", toolset.name, exc_info=True)

    async def record_decision(self, decision: dict[str, Any]) -> None:
        """Add a person's decision on one of the run's calls to its record in the session."""
        assert self.record is not None, "a decision before the run started"
        self.record.decisions.append(decision)
        await self.session.save_run(self.record)

    async def _turns(self, tools: ToolCallExecutor) -> tuple[AgentStatus, str | None, float]:
        """The run's turns: how it stopped, and when (the journaled time of the model step that
        stopped it, so the end needs no step of its own)."""
        turn = misses = 0  # misses: answers that gave no accepted output (an `Output`)
        output = self.agent.output
        while True:
            response = await self._model_call(turn)
            if "decision" in response:  # the run stops before this turn's model call
                return response["decision"], None, response["at"]
            if "error" in response:
                ended_as: AgentStatus = "budget_exceeded" if response.get("capped") else "error"
                return ended_as, response["error"], response["at"]
            if response.get("aborted"):
                return "aborted", None, response["at"]
            content = response["content"]
            self._count_model_call(response)
            turn_id = await self._append(
                "assistant", content, created_at=response["at"], usage=response["usage"]
            )
            text = text_of(content)
            self.stats.text = text or self.stats.text
            calls = tool_uses(content)
            await self._publish(*self._model_events(turn, response, text, calls))
            if not calls:
                await self._turn_end(turn, response, response["at"])
                # the answer's step looked at the inbox once the model had answered
                looked = response.get("inbox")
                follow_ups = [] if looked is False else await self._take_messages(turn)
                if not follow_ups and output is not None:  # text only: not the answer
                    misses += 1
                    if misses > output.retries:
                        error = f"the model answered in text {misses} times, not with {output.name}"
                        return "error", error, response["at"]
                    follow_ups = [text_block(output.reminder)]
                if not follow_ups:
                    return "completed", None, response["at"]
                await self._append("user", follow_ups, created_at=response["at"])
                turn += 1
                continue
            results, finished_at, outcomes = await tools.execute(calls, turn_id, turn)
            await self._turn_end(turn, response, finished_at)
            await self._publish(
                *[event("tool_finished", self.run_id, finished_at, **o) for o in outcomes]
            )
            if output is not None and any(c["name"] == output.name for c in calls):
                refused = self._final_answer(output, calls, results)
                misses += refused is not None
                if refused is None or misses > output.retries:
                    await self._append("user", results, created_at=finished_at)
                    if refused is None:
                        return "completed", None, finished_at
                    error = f"the final answer did not match its schema {misses} times"
                    return "error", f"{error}: {refused}", finished_at
            steering = await self._take_messages(turn) if self._steering(finished_at) else []
            await self._append("user", [*results, *steering], created_at=finished_at)
            turn += 1

    def _final_answer(self, output: Output, calls: list[Any], results: list[Any]) -> str | None:
        """None: the turn's first accepted call of the output tool gave the run its output (in
        `stats`); else why the last call of it was refused."""
        refused = ""
        for call, result in zip(calls, results, strict=True):
            if call["name"] != output.name:
                continue
            content = result["content"]
            if not result.get("is_error"):
                self.stats.output = output.value(call["input"])
                self.stats.text = dumps(self.stats.output).decode()
                return None
            refused = content if isinstance(content, str) else text_of(content)
        return refused

    async def _turn_end(self, turn: int, response: dict[str, Any], ended_at: float) -> None:
        """`turn:end`, with the turn's journaled start and end; it fires on replays too."""
        if not self.agent.hooks.wants("turn:end"):
            return
        started = response["at"] - response.get("latency_ms", 0.0)
        payload = {"turn": turn, "run_id": self.run_id, "started_at": started, "ended_at": ended_at}
        await self.agent.hooks.call("turn:end", payload)

    # Events ------------------------------------------------------------------------------

    async def _publish(self, *events: JSON) -> None:
        """Durable events of journaled values, appended outside any step (once per journal
        position where the log's writes are journaled)."""
        log = self.durable.stores.events
        if log is not None and events:
            await log.append(self.session.id, events)

    def _live_log(self) -> EventLog | None:
        """The session's event log when it passes live events on."""
        log = self.durable.stores.events
        return log if log is not None and log.live_wanted else None

    def _live(self, kind: str, **fields: Any) -> None:
        """A live event, made only when the session's event log passes live events on."""
        log = self._live_log()
        if log is not None:
            log.live(self.session.id, event(kind, self.run_id, now_ms(), **fields))

    def _model_events(
        self, turn: int, response: dict[str, Any], text: str, calls: list[Any]
    ) -> list[JSON]:
        at = response["at"]
        events = [
            event(
                "model_done",
                self.run_id,
                at,
                turn=turn,
                usage=response["usage"],
                cost_usd=response.get("cost", 0.0),
                stop=response.get("stop"),
                text=text,
                tool_calls=[{"id": c["id"], "name": c["name"]} for c in calls],
            )
        ]
        if "model" in response:  # one of several models answered: the event names it
            events[0] |= {"provider": response["provider"], "model": response["model"]}
        if not self.limits:
            return events
        behavior, spent_so_far = self.behavior, self._spent()
        budgets = [
            ("cost_usd", behavior.max_cost_usd, spent_so_far.cost_usd),
            ("tokens", behavior.max_tokens, spent_so_far.tokens),
        ]
        for kind, limit, spent in budgets:
            # Once per run and budget: the turn that first crosses 80% of it.
            if limit and spent >= BUDGET_WARNING * limit and kind not in self._warned:
                self._warned.add(kind)
                events.append(
                    event("budget_warning", self.run_id, at, budget=kind, spent=spent, limit=limit)
                )
        return events

    async def _take_messages(self, turn: int) -> list[Any]:
        """The inbox's messages at the end of `turn`, as text blocks (none without an inbox)."""
        inbox = self.agent.inbox
        if inbox is None:
            return []
        messages = await inbox.take(self.durable, f"inbox:{turn}")
        return [text_block(message) for message in messages]

    def _steering(self, finished_at: float) -> bool:
        """Whether to take the inbox's messages now, after a turn's tool calls. Its messages
        are wanted at the first such boundary, then at most every `STEERING_EVERY_MS` of the
        calls' journaled end times (turns quicker than people write skip them; the answer's
        boundary always looks). When the inbox can tell without a take (`Inbox.look`), the
        next model step looks first instead, and a take follows only if something came."""
        inbox = self.agent.inbox
        due = self._steered_at is None or finished_at - self._steered_at >= STEERING_EVERY_MS
        if inbox is None or not due:
            return False
        self._steered_at = finished_at
        if inbox.look() is None:
            return True
        self._look_first = True
        return False

    def _decide(self, worst: Spend | None) -> str:
        if self.abort.is_set():
            return "aborted"
        if self.stats.turns >= self.behavior.max_turns:
            return "max_turns"
        if worst is None or (self.ledger is not None and self.agent.budget_tree):
            return "continue"  # a sub-agent's call fits if its tree's ledger holds room for it
        if self.limits.exceeded_by(self._spent() + worst):
            return "budget_exceeded"  # the call could pass the budget: it does not start
        return "continue"

    @staticmethod
    async def _value(value: dict[str, Any]) -> JSON:
        return {**value, "at": now_ms()}

    # Model calls ---------------------------------------------------------------------------

    async def _model_call(self, turn: int) -> dict[str, Any]:
        """One model step, retried with journaled backoff while the error is retryable. A
        failed call moves on to the agent's next fallback model at once; the last one's
        retryable failure backs off and starts again from the first. A final error comes back
        as `{"error": ...}`."""
        attempt = retries = model = 0  # every step of the turn; those after an error; which model
        while True:
            name = f"model:{turn}:{attempt}"
            budgeted = bool(self.limits or self.ledger)
            worst = self._worst_case(turn, model) if budgeted else None
            granted = await self._reserve(name, worst) if budgeted else True
            look_first, self._look_first = self._look_first, False
            result: dict[str, Any] = await self.durable.step(
                "model",
                name,
                self._model_fn(turn, attempt, retries, worst, granted, look_first, model),
            )
            if budgeted:
                if result.get("charged") and worst is not None:
                    self._charged += worst
                await self._settle(name, result, worst)
            if result.get("decision") == "budget_exceeded" and await self._more_budget(
                f"{BUDGET_TOOL}:{turn}:{attempt}", worst
            ):
                attempt += 1
                continue  # decided again, against the raised budget
            if result.get("steer"):  # messages came after the last turn's tools: they go first
                messages = await self._take_messages(turn - 1)
                if messages:
                    await self._append("user", messages, created_at=result["at"])
                attempt += 1
                continue  # decided again: the messages make the request larger
            if "error" in result and result.get("fallback"):  # journaled: a replay asks the same
                attempt += 1
                model += 1
                continue
            if "error" not in result or not result["retry"]:
                return result
            waits = bool(result.get("capped"))  # for the spend cap's next period: not a retry
            sleep = f"backoff:{turn}:{attempt}"
            if waits:
                until = result["at"] + round(result["retry_after"] * 1000)
                cap = result.get("cap")
                await self._publish(
                    event(
                        "spend_cap_waiting",
                        self.run_id,
                        result["at"],
                        until=until,
                        reason=result["error"],
                        **({"cap": cap} if cap else {}),
                    )
                )
                if cap:  # what Restate shows it waits for (`restate invocations describe`)
                    sleep = f"spend-cap:{turn}:{attempt}:{cap}"
            await self.durable.sleep(backoff_ms(retries, result.get("retry_after")), sleep)
            attempt += 1
            retries += 0 if waits else 1
            model = 0

    def _model_fn(
        self,
        turn: int,
        attempt: int,
        retries: int,
        worst: Spend | None,
        granted: bool,
        look_first: bool,
        model: int,
    ) -> Callable[[], Awaitable[JSON]]:
        inbox = self.agent.inbox
        provider, max_output = self._model(turn, model)
        fallbacks = len(self.agent.fallbacks)
        # The last model is always asked; the others are skipped while they keep failing.
        cooldown = self.agent.cooldown if model < fallbacks else None

        async def call() -> JSON:
            # Whether the turn happens at all is decided in its model step, not a step of its
            # own: a stop (aborted, max turns, budget) is journaled in place of the model's
            # answer, so a replay takes the same path even if the budgets in the code changed.
            decision = self._decide(worst)  # a retry too: a charged failure leaves less room
            if decision == "continue" and not granted:
                decision = "budget_exceeded"  # the ledger holds no room for this call
            if decision != "continue":
                return {"decision": decision, "at": now_ms()}
            if self.abort.is_set():
                return {"aborted": True, "at": now_ms()}
            # Looked at here, the inbox costs no step of its own when nothing came.
            if look_first and inbox is not None and inbox.look() is not False:
                return {"steer": True, "at": now_ms()}
            hooks = self.agent.hooks
            if cooldown is not None and (left := cooldown.skips(model)) is not None:
                # journaled as a failure: a replay skips it too
                skipped = {
                    "error": f"{provider.name}: {provider.model} skipped, cooling down for "
                    f"{left:.0f} s more after failing {cooldown.failures} calls in a row",
                    "retry": False,
                    "retry_after": None,
                    "at": now_ms(),
                    "fallback": True,
                    "skipped": True,
                    **self._which(provider),
                }
                await hooks.call("turn:error", {"turn": turn, "run_id": self.run_id, **skipped})
                return skipped
            request = await self._request(turn, provider, max_output)
            streamed: list[str] = []
            # The step's name and the run's id name the call: a crash that cuts it off and
            # runs it again starts the same call twice, which the live stream reports.
            call = f"{self.run_id}/model:{turn}:{attempt}"
            self._live("model_started", turn=turn, call=call)
            # decided once per call, not per delta
            live = self._live if self._live_log() is not None else None
            text_hook = hooks.wants("stream:text")

            async def on_text(delta: str) -> None:
                streamed.append(delta)
                if live is not None:
                    live("model_text", call=call, delta=delta)
                if text_hook:  # the text so far: quadratic in the deltas
                    await hooks.call("stream:text", {"delta": delta, "text": "".join(streamed)})

            started = now_ms()
            try:
                response = await self.abort.race(provider.complete(request, on_text))
            except Aborted:  # cut off mid-call: what the provider generated may be charged
                return {"aborted": True, "charged": True, "at": now_ms()}
            except ProviderError as error:
                capped = isinstance(error, SpendCapReached)
                if cooldown is not None and error.retryable and not capped:
                    cooldown.failed(model)
                # Journaled like a success: a replay takes the same retry (or stop) decision.
                # Any failure moves on to a fallback: another model may answer what this one
                # refused (a key, a quota, a context window, a spend cap: its own, or the
                # agent's, which a cheaper call may fit); the last one's decides the retry.
                fallback = model < fallbacks
                failed: dict[str, Any] = {
                    "error": f"{error.provider}: {error}",
                    # A cap that waits is asked again however often it refused.
                    "retry": error.retryable
                    and not fallback
                    and (capped or retries < self.behavior.max_retries),
                    "retry_after": error.retry_after,
                    "at": now_ms(),
                }
                if fallbacks:
                    failed |= {"fallback": fallback, **self._which(provider)}
                if capped:  # not made: not the model's fault (also when it falls back)
                    failed["capped"] = True
                    if failed["retry"] and isinstance(error, SpendCapReached):  # names its wait
                        failed["cap"] = error.refusal.cap.label
                if error.may_have_charged:  # the run's budget counts its worst case
                    failed["charged"] = True
                await hooks.call(
                    "turn:error",
                    {"turn": turn, "run_id": self.run_id, **self._which(provider), **failed},
                )
                return failed
            if cooldown is not None:
                cooldown.answered(model)
            if streamed and hooks.wants("stream:end"):
                await hooks.call("stream:end", {"text": "".join(streamed)})
            pricing = provider.pricing
            cost = pricing.cost(response.usage) if pricing else 0.0
            ended = now_ms()
            value = {
                "content": response.content,
                "usage": response.usage,
                "stop": response.stop_reason,
                "cost": cost,
                "latency_ms": ended - started,
                "at": ended,
            }
            if fallbacks:  # which model answered: its events and the run's record say
                value |= self._which(provider)
            if inbox is not None and not tool_uses(response.content):
                value["inbox"] = inbox.look()  # for the answer's boundary
            if hooks.wants("turn:after"):
                await hooks.call(
                    "turn:after",
                    {
                        "turn": turn,
                        "usage": response.usage,
                        "cost": cost,
                        "content": response.content,
                        "latency_ms": value["latency_ms"],
                        "stop": response.stop_reason,
                        "run_id": self.run_id,
                        **self._which(provider),
                    },
                )
            return value

        return call

    # Budget ---------------------------------------------------------------------------------

    def _model(self, turn: int, index: int) -> tuple[Provider, int]:
        """The provider of a turn's `index`th model (0: the agent's, then its fallbacks) and the
        output tokens its calls ask for."""
        if index == 0:
            return self.agent.provider, self.behavior.max_output_tokens
        fallbacks = self.agent.fallbacks
        if index > len(fallbacks):
            raise ConfigError(
                f"the journal of run {self.run_id!r} moved model:{turn} on to fallback model "
                f"{index}, and this agent has {len(fallbacks)}: its models changed since the "
                "run started; finish it with the models it started with"
            )
        chosen = fallbacks[index - 1]
        return chosen.provider, chosen.max_output_tokens or self.behavior.max_output_tokens

    @staticmethod
    def _which(provider: Provider) -> dict[str, str]:
        return {"provider": provider.name, "model": provider.model}

    def _worst_case(self, turn: int, model: int) -> Spend:
        """The most the turn's next call (to its `model`th model) can cost: every input token
        it can send (a bound from the session's journaled turns, so a replay computes the
        same), and the output and thinking tokens it may get, at the highest price."""
        provider, max_output = self._model(turn, model)
        prefix = [self.agent.system or "", [t.spec for t in self.tool_defs]]
        output = max_output + (self.behavior.thinking_budget or 0)
        bound = input_bound(self.session.turns, prefix, self.run_id)
        return worst_case(bound, output, provider.pricing)

    async def _more_budget(self, call_id: str, worst: Spend | None) -> bool:
        """With `on_budget_exhausted="ask"`, ask a person for the budget again, as an approval
        of the pseudo-call `budget` (listed, answered and audited like any approval); True:
        approved, and each limit is raised by its size, or to the amounts the approval gives
        (`granted`). The answer is journaled by the wait, so a replay raises the same limits.
        A sub-agent does not ask: it stops and reports to its parent, whose next call asks for
        the whole tree."""
        wait = self.agent.wait
        if self.behavior.on_budget_exhausted != "ask" or wait is None or self.agent.is_sub_agent:
            return False
        behavior, limits = self.behavior, self.limits
        raised = Limits(
            _plus(limits.cost_usd, behavior.max_cost_usd), _plus(limits.tokens, behavior.max_tokens)
        )
        spent = self._spent()
        request = {  # what the person reads: the amounts of the budgets that are set
            "spent": _set(spent.to_json(), limits),
            "budget": _set(limits.to_json(), limits),
            "next_call_at_most": _set(worst.to_json(), limits) if worst else None,
            "raise_to": _set(raised.to_json(), limits),
        }
        context = ToolContext(
            call_id=call_id,
            turn_id=call_id,
            tool_name=BUDGET_TOOL,
            run_id=self.run_id,
            session_id=self.session.id,
            durable=self.durable.scope(call_id),
            signal=self.abort.event,
            depth=self.agent.depth,
            agent=self.agent,
            run_stats=self.stats,
            record_decision=self.record_decision,
            budget_tree=self.budget_tree,
        )
        decided = await approval(wait, context, request, "deny")
        if not decided.approved:
            return False
        self.limits = granted(decided.value, limits, raised)  # the ledger's at the next reserve
        self._warned.clear()  # a raised budget warns again at 80% of it
        at = await self.durable.now()
        request["raise_to"] = _set(self.limits.to_json(), limits)
        await self._publish(event("budget_raised", self.run_id, at, **request))
        return True

    def _spent(self) -> Spend:
        """What the run's budget counts as spent: its calls' usage (its sub-agents' too), and the
        worst cases of its failed calls the provider may have charged."""
        return Spend(self.stats.total_cost_usd, self.stats.total_tokens) + self._charged

    def _ledger_key(self, name: str) -> str:
        return f"{self.run_id}/{name}"

    async def _reserve(self, name: str, worst: Spend | None) -> bool:
        """Hold the call's worst case in the budget's ledger; False: no room, it must not start."""
        if self.ledger is None or self.budget_tree is None or worst is None:
            return True
        # The root's limits set the tree's (and raise them); a sub-agent's own are its share.
        limits = self.limits if self.limits and not self.agent.budget_tree else None
        return await self.ledger.reserve(self.budget_tree, self._ledger_key(name), worst, limits)

    async def _settle(self, name: str, result: dict[str, Any], worst: Spend | None) -> None:
        """Count what the call spent (nothing, when it did not happen; its worst case, when it
        failed after the provider may have charged it) and free its hold."""
        if self.ledger is None or self.budget_tree is None:
            return
        actual = Spend()
        if "content" in result:
            actual = Spend(float(result.get("cost") or 0.0), usage_tokens(result["usage"]))
        elif result.get("charged"):
            actual = worst or Spend()
        await self.ledger.settle(self.budget_tree, self._ledger_key(name), actual)

    async def _request(self, turn: int, provider: Provider, max_output: int) -> ModelRequest:
        agent = self.agent
        messages: list[Message] = self.session.messages()
        if self.behavior.compact_strategy == "tail":
            budget = (
                provider.context_window
                - max_output
                - estimate_tokens(agent.system or "")
                - estimate_tokens([t.spec.input_schema for t in self.tool_defs])
            )
            messages = compact_tail(messages, budget, omitted=self.session.earlier.turns)
        hooks = agent.hooks
        if hooks.wants("context:transform"):
            messages = (await hooks.call("context:transform", {"messages": messages}))["messages"]
        request = ModelRequest(
            messages=messages,
            system=agent.system,
            tools=[t.spec for t in self.tool_defs],
            max_output_tokens=max_output,
            thinking_budget=self.behavior.thinking_budget,
            cache=self.behavior.cache,
            assistant_turns=self.session.assistant_turns,
            tool_required=agent.output is not None,
        )
        if hooks.wants("turn:before"):
            await hooks.call(
                "turn:before", {"turn": turn, "request": request, "run_id": self.run_id}
            )
        return request

    # Bookkeeping ---------------------------------------------------------------------------

    def _count_model_call(self, response: dict[str, Any]) -> None:
        usage = response["usage"]
        stats = self.stats
        stats.turns += 1
        stats.input_tokens += usage.get("input", 0)
        stats.output_tokens += usage.get("output", 0)
        stats.cache_read_tokens += usage.get("cache_read", 0)
        stats.cache_write_tokens += usage.get("cache_write", 0)
        stats.cost_usd += response.get("cost", 0.0)

    async def _append(
        self,
        role: Any,
        content: list[Any],
        *,
        created_at: float,
        usage: Any = None,
    ) -> str:
        turn_id = self.durable.uuid()
        await self.session.append_turns(
            [
                SessionTurn(
                    id=turn_id,
                    role=role,
                    content=content,
                    created_at=created_at,
                    usage=usage,
                    run_id=self.run_id,
                )
            ]
        )
        return turn_id


def _plus(limit: float | None, size: float | None) -> Any:
    """`limit` raised by `size` (a limit that is not set stays unset)."""
    return None if limit is None or size is None else limit + size


def _set(amounts: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """`amounts` of the budgets `limits` sets."""
    return {kind: value for kind, value in amounts.items() if getattr(limits, kind) is not None}


def granted(value: Any, limits: Limits, default: Limits) -> Limits:
    """The limits an approval of more budget grants: the amounts its `raise_to` gives
    (`{"approved": true, "raise_to": {"cost_usd": 5}}`), never below `limits`, for the limits
    that are set; `default` for the others, or when it gives none."""
    given = value.get("raise_to") if isinstance(value, dict) else None
    if not isinstance(given, dict):
        return default

    def amount(kind: str) -> Any:
        wanted = given.get(kind)
        if isinstance(wanted, bool) or not isinstance(wanted, int | float):
            return getattr(default, kind)
        if getattr(limits, kind) is None or not math.isfinite(wanted):
            return getattr(default, kind)
        return wanted

    tokens = amount("tokens")
    named = Limits(amount("cost_usd"), None if tokens is None else int(tokens))
    return named.raised_to(limits)  # the ledger's rule: a budget only ever rises
