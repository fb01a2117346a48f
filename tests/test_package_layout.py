"""The package loads only what a module needs: `import tether.spec` (the operator) loads no agent
loop, and `tether.durable.ids` no backend. The top-level names load on first use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def loaded_by(*modules: str) -> list[str]:
    """The tether modules a fresh interpreter has loaded after importing `modules`."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('tether'))))"
    )
    command = [sys.executable, "-c", code]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    loaded: list[str] = json.loads(result.stdout)
    return loaded


RUNTIME = ("tether.agent", "tether.durable.sqlite", "tether.restate", "tether.providers")


def test_the_spec_loads_no_runtime() -> None:
    loaded = loaded_by("tether.spec", "tether.spec.crd", "tether_operator.render")
    assert not [m for m in loaded if m.startswith(RUNTIME)], loaded
    assert not [m for m in loaded if m.startswith("tether.programs.worker")], loaded


def test_a_leaf_loads_nothing_above_it() -> None:
    loaded = loaded_by("tether.durable.ids", "tether.messages")
    assert set(loaded) <= {
        "tether",
        "tether._lazy",
        "tether.durable",
        "tether.durable.ids",
        "tether.messages",
    }, loaded


def test_the_top_level_names_load_on_first_use() -> None:
    import tether
    from tether.agent import create_agent
    from tether.durable.sqlite import sqlite_runtime

    assert tether.create_agent is create_agent
    assert tether.durable.sqlite_runtime is sqlite_runtime
    assert {"create_agent", "ToolError", "TetherError"} <= set(dir(tether))
    assert set(tether.__all__) <= set(dir(tether))
    with pytest.raises(AttributeError, match="module 'tether' has no attribute 'nothing'"):
        _ = tether.nothing  # type: ignore[attr-defined]
