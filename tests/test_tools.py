"""`@tool` schemas and validation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import Field

from tether import ToolContext, tool
from tether.tools import ToolError
from tether.tools.validation import validation_error


def test_the_schema_comes_from_the_signature() -> None:
    @tool(name="search", replay="safe", concurrency_safe=True)
    async def find(
        query: Annotated[str, Field(description="What to look for")],
        limit: int = 10,
        mode: Literal["fast", "deep"] = "fast",
        ctx: ToolContext | None = None,
    ) -> str:
        """Searches the index."""
        return query

    assert find.spec.name == "search"
    assert find.spec.description == "Searches the index."
    assert find.replay == "safe" and find.is_concurrency_safe
    schema = find.spec.input_schema
    assert schema["required"] == ["query"]
    assert schema["properties"]["query"]["description"] == "What to look for"
    assert schema["properties"]["limit"] == {"default": 10, "title": "Limit", "type": "integer"}
    assert schema["properties"]["mode"]["enum"] == ["fast", "deep"]


def test_a_tool_needs_a_description_and_an_async_function() -> None:
    with pytest.raises(TypeError, match="needs a description"):

        @tool
        async def undocumented() -> str:
            return ""

    with pytest.raises(TypeError, match="must be an async function"):
        tool(lambda: "x")  # type: ignore[arg-type,return-value]


def test_validation_errors_name_the_field() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["n"],
    }
    assert validation_error(schema, {"n": 1}) is None
    assert validation_error(schema, {}) == "input: 'n' is a required property"
    assert validation_error(schema, {"n": "x"}) == "n: 'x' is not of type 'integer'"
    assert validation_error(schema, {"n": 1, "tags": [1]}) == "tags/0: 1 is not of type 'string'"


def test_the_validation_shortcut_never_accepts_what_jsonschema_rejects() -> None:
    from tether.tools.validation import validator_for

    kinds = ["string", "integer", "number", "boolean", "null", "array", "object", ["string"]]
    values = ["a", 1, 1.0, 2.5, True, None, [1], {"a": 1}]
    shortcuts = 0
    for kind in [*kinds, None]:  # None: a property of any type
        typed = {} if kind is None else {"type": kind}
        for extra in ({}, {"minLength": 2}, {"enum": ["a"]}, {"title": "A", "default": 1}):
            for additional in (True, False, {"type": "string"}):
                schema = {
                    "type": "object",
                    "properties": {"a": {**typed, **extra}},
                    "required": ["a"],
                    "additionalProperties": additional,
                }
                validator = validator_for(schema)
                for value in values:
                    for arguments in ({"a": value}, {"a": value, "b": value}, {"b": value}):
                        if validator.surely_valid(arguments):
                            shortcuts += 1
                            assert validator.jsonschema.is_valid(arguments), (schema, arguments)
    assert shortcuts  # the usual schemas do take the shortcut


async def test_file_tools_stay_inside_the_workspace(tmp_path: Path) -> None:
    from tether.tools.builtin import file_tools

    read, write, append, listing = file_tools(tmp_path)
    ctx = None  # the file tools take no context
    assert await write.execute({"path": "a/b.txt", "content": "hi"}, ctx) == (  # type: ignore[arg-type]
        "wrote 2 bytes to a/b.txt"
    )
    await append.execute({"path": "a/b.txt", "content": "!"}, ctx)  # type: ignore[arg-type]
    assert await read.execute({"path": "a/b.txt"}, ctx) == "hi!"  # type: ignore[arg-type]
    (tmp_path / ".hidden").write_text("x")
    assert await listing.execute({}, ctx) == "a/b.txt"  # type: ignore[arg-type]
    for escape in ("../outside.txt", "/etc/passwd", "a/../../x"):
        with pytest.raises(ToolError, match="outside the workspace"):
            await read.execute({"path": escape}, ctx)  # type: ignore[arg-type]
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(ToolError, match="outside the workspace"):
        await read.execute({"path": "link/passwd"}, ctx)  # type: ignore[arg-type]


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "without openat2"])
async def test_a_file_swapped_for_a_symlink_after_its_check_is_not_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openat2: bool
) -> None:
    """A command of the agent's can swap a file the tool just checked for a symlink out (to
    `/proc/self/environ`: the worker's own secrets) before the tool opens it: the open itself
    refuses, whatever the check said. The race is won here for the attacker by skipping the
    check (`Workspace.check`), as a swap between the two would."""
    from tether.tools.builtin import file_tools, files

    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("the worker's")
    (workspace / "swapped").symlink_to(outside / "secret")
    (workspace / "dir").symlink_to(outside)
    (workspace / "kept").write_text("ok")
    (workspace / "alias").symlink_to("kept")  # a symlink that stays inside is followed
    monkeypatch.setattr(files.Workspace, "check", lambda self, relative: None)
    if not openat2:
        monkeypatch.setattr(files, "_OPENAT2", -1)  # an unknown call: ENOSYS, the fallback
    read, write, append, _ = file_tools(workspace)
    for file_tool, arguments in [
        (read, {"path": "swapped"}),
        (read, {"path": "dir/secret"}),
        (write, {"path": "swapped", "content": "x"}),
        (append, {"path": "dir/planted", "content": "x"}),
        (write, {"path": "dir/new/planted", "content": "x"}),
    ]:
        with pytest.raises(ToolError, match=r"outside the workspace|is a symlink"):
            await file_tool.execute(arguments, None)  # type: ignore[arg-type]
    assert (outside / "secret").read_text() == "the worker's"
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    if openat2:  # else the last part is never followed
        assert await read.execute({"path": "alias"}, None) == "ok"  # type: ignore[arg-type]


async def test_the_file_tools_refuse_odd_paths_plainly_and_hold_no_descriptor(
    tmp_path: Path,
) -> None:
    """Each a tool error naming the path the model gave, never the workspace's; a refused read
    keeps no descriptor open (a model repeating one must not exhaust the worker's)."""
    from tether.tools.builtin import file_tools

    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("x")
    (workspace / "d").mkdir()
    (workspace / "loop").symlink_to("loop")
    (workspace / "out").symlink_to(outside)
    os.mkfifo(workspace / "fifo")
    read, write, _, listing = file_tools(workspace)
    refusals = [
        (read, "d", "is not a regular file"),
        (read, ".", "is not a regular file"),
        (read, "fifo", "is not a regular file"),
        (read, "a\0b", "is not a path"),
        (read, "loop", "a symlink loop"),
        (write, "d", "Is a directory"),
        (write, "fifo", "No such device or address"),  # no reader: refused, not blocked
        (write, "a/" * 600 + "x", "longer than 1024 characters"),
        (listing, "out", "outside the workspace"),
        (listing, "nothing", "no such directory"),
    ]
    descriptors = len(os.listdir("/proc/self/fd"))
    for tool_def, path, refusal in refusals:
        arguments = {"path": path} | ({"content": "x"} if tool_def is write else {})
        with pytest.raises(ToolError, match=refusal) as refused:
            await tool_def.execute(arguments, None)  # type: ignore[arg-type]
        assert str(workspace) not in str(refused.value)
    for _ in range(50):
        with pytest.raises(ToolError):
            await read.execute({"path": "d"}, None)  # type: ignore[arg-type]
    assert len(os.listdir("/proc/self/fd")) == descriptors
    assert not (workspace / "a").exists()
    # The regular files; a symlink out is never walked through.
    (workspace / "d" / "kept.txt").write_text("x")
    assert await listing.execute({}, None) == "d/kept.txt"  # type: ignore[arg-type]


async def test_write_file_makes_the_workspace_it_writes_in(tmp_path: Path) -> None:
    from tether.tools.builtin import file_tools

    _, write, _, _ = file_tools(tmp_path / "not yet")
    assert await write.execute({"path": "a.txt", "content": "hi"}, None) == (  # type: ignore[arg-type]
        "wrote 2 bytes to a.txt"
    )
    assert (tmp_path / "not yet" / "a.txt").read_text() == "hi"
