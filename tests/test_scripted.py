"""The scripted provider: one list of responses, or lists keyed by the conversation's prompt."""

from __future__ import annotations

from typing import Any

import pytest

from tether import create_agent
from tether.agent import spawn_tool
from tether.messages import Message, text_block, tool_result, user_message
from tether.providers import ScriptedProvider, ScriptExhaustedError, scripted
from tether.providers.base import ModelRequest
from tether.spec import SpecError, parse_agent
from tether.spec.assemble import provider_from_spec


def request(*messages: Message) -> ModelRequest:
    return ModelRequest(messages=list(messages))


def assistant(text: str) -> Message:
    return {"role": "assistant", "content": [text_block(text)]}


def text(response: Any) -> str:
    return "".join(b["text"] for b in response.content if b["type"] == "text")


async def test_a_list_plays_in_order_by_assistant_turns() -> None:
    provider = scripted([{"text": "one"}, {"text": "two"}])
    first = await provider.complete(request(user_message("anything")))
    second = await provider.complete(
        request(user_message("anything"), assistant("one"), user_message("more"))
    )
    assert (text(first), text(second)) == ("one", "two")
    assert provider.responses == [{"text": "one"}, {"text": "two"}]


async def test_a_mapping_picks_the_list_by_the_first_user_message() -> None:
    provider = scripted(
        {
            "parent task": [{"text": "parent 1"}, {"text": "parent 2"}],
            "child task": [{"text": "child 1"}],
            "*": [{"text": "anyone 1"}, {"text": "anyone 2"}],
        }
    )
    parent = await provider.complete(request(user_message("parent task")))
    child = await provider.complete(request(user_message("child task")))
    other = await provider.complete(request(user_message("something else")))
    assert [text(r) for r in (parent, child, other)] == ["parent 1", "child 1", "anyone 1"]
    # Later turns: still chosen by the FIRST user message, indexed by the assistant turns.
    later = request(
        user_message("parent task"),
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "c", "name": "t", "input": {}}],
        },
        {"role": "user", "content": [tool_result("c", "child task")]},
    )
    assert text(await provider.complete(later)) == "parent 2"
    follow_up = request(user_message("something else"), assistant("x"), user_message("parent task"))
    assert text(await provider.complete(follow_up)) == "anyone 2"


async def test_the_match_is_exact() -> None:
    provider = scripted({"deploy": [{"text": "exact"}], "*": [{"text": "default"}]})
    for prompt in ("deploy ", "Deploy", "deploy it"):
        assert text(await provider.complete(request(user_message(prompt)))) == "default"


async def test_without_a_default_an_unknown_prompt_is_a_clear_error() -> None:
    provider = scripted({"alpha": [{"text": "a"}], "beta": [{"text": "b"}]})
    with pytest.raises(ScriptExhaustedError) as caught:
        await provider.complete(request(user_message("gamma")))
    message = str(caught.value)
    assert "no script for the prompt 'gamma'" in message
    assert "'alpha', 'beta'" in message and "`*`" in message
    assert provider.calls == 0


async def test_an_exhausted_keyed_script_names_its_prompt() -> None:
    provider = scripted({"alpha": [{"text": "a"}], "*": [{"text": "x"}]})
    with pytest.raises(ScriptExhaustedError, match="the script for 'alpha' has 1 responses"):
        await provider.complete(request(user_message("alpha"), assistant("a"), user_message("?")))


def test_an_empty_mapping_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one prompt"):
        ScriptedProvider({})


async def test_a_parent_and_its_children_follow_their_own_scripts() -> None:
    provider = scripted(
        {
            "split the work": [
                {"tool_calls": [{"name": "spawn", "input": {"task": "part one"}}]},
                {"tool_calls": [{"name": "spawn", "input": {"task": "part two"}}]},
                {"text": "both parts done"},
            ],
            "part one": [{"text": "one is done"}],
            "*": [{"text": "some part is done"}],
        }
    )
    agent = create_agent(provider=provider, tools=[spawn_tool(provider=provider)])
    stats = await agent.run("split the work")
    assert stats.status == "completed" and stats.text == "both parts done"
    assert [c.text for c in stats.children] == ["one is done", "some part is done"]


def manifest(script: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "scripted"},
        "spec": {"model": {"provider": "scripted", "name": "s", "script": script}},
    }


async def test_the_spec_takes_a_keyed_script() -> None:
    keyed = {"hello": [{"text": "hi"}], "*": [{"text": "what?"}]}
    spec = parse_agent(manifest(keyed)).spec
    assert spec.model.script == keyed
    provider = provider_from_spec(spec, "")
    assert isinstance(provider, ScriptedProvider)
    assert text(await provider.complete(request(user_message("hello")))) == "hi"
    assert text(await provider.complete(request(user_message("bye")))) == "what?"
    assert parse_agent(manifest([{"text": "plain"}])).spec.model.script == [{"text": "plain"}]
    # in a DurableAgent (whose schema takes lists only): {prompt, responses} entries
    entries = [{"prompt": prompt, "responses": responses} for prompt, responses in keyed.items()]
    assert parse_agent(manifest(entries)).spec.model.script == keyed


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ([], "needs `script`: a list of responses, or a mapping from a prompt"),
        ({}, "spec.model.script: must not be empty"),
        ("hello", "spec.model.script: must be a list of responses, or a mapping"),
        ([{"text": "a"}, "b"], "spec.model.script: response 2 must be a mapping"),
        ({"p": []}, "spec.model.script: the script for prompt 'p' must be a non-empty list"),
        ({"p": {"text": "a"}}, "the script for prompt 'p' must be a non-empty list"),
        ({"p": [7]}, "response 1 for prompt 'p' must be a mapping"),
        ({1: [{"text": "a"}]}, "the prompt 1 must be a string; quote it"),
        (
            [{"prompt": "p", "responses": [{"text": "a"}]}] * 2,
            "spec.model.script: a prompt has two entries",
        ),
        ([{"prompt": "p", "responses": []}], "the script for prompt 'p' must be a non-empty"),
    ],
)
def test_a_bad_script_is_a_clear_spec_error(script: Any, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_agent(manifest(script))
    assert message in str(caught.value)
    assert "list[dict" not in str(caught.value)  # no pydantic type names
