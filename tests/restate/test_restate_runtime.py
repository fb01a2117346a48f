"""`restate_runtime` on the real restate-server: the reference example works as written."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from tests.restate.support import ServedApp, http
from tether.programs.restate_server import RestateServer

ALL_CALLS = [f"call_{t}_{i}" for t, n in enumerate([1, 1, 3, 1, 2, 1, 1]) for i in range(n)]


def call(server: RestateServer, handler: str, key: str, payload: Any = None) -> Any:
    url = f"{server.ingress_url}/CrashAgent/{key}/{handler}"
    response = http("POST", url, payload)
    assert response.status == 200, response.text
    return response.json()


def check_transcript(turns: list[dict[str, Any]]) -> None:
    seen: list[str] = []
    for i, turn in enumerate(turns):
        uses = [b["id"] for b in turn["content"] if b["type"] == "tool_use"]
        if uses:
            results = [b["tool_use_id"] for b in turns[i + 1]["content"]]
            assert results == uses
            seen += uses
    assert seen == ALL_CALLS


def test_the_reference_example_runs_on_a_real_server(serve_app: Any, tmp_path: Path) -> None:
    served: ServedApp = serve_app("agent_service")
    effects = tmp_path / "effects"
    key = f"s-{uuid.uuid4().hex[:8]}"
    result = call(served.server, "run", key, {"effects": str(effects)})
    assert result["status"] == "completed" and result["turns"] == 8
    assert result["tool_calls"] == len(ALL_CALLS)
    lines = effects.read_text().splitlines()
    assert Counter(line.split()[1] for line in lines) == Counter(ALL_CALLS)
    check_transcript(call(served.server, "transcript", key))


def test_every_await_suspending_gives_the_same_run(
    serve_app: Any, restate_server_always_suspend: RestateServer, tmp_path: Path
) -> None:
    """The determinism check: with the inactivity timeout at 0 every await suspends and the
    handler replays its journal from the top; a non-deterministic step would fail the run."""
    served: ServedApp = serve_app("agent_service", server=restate_server_always_suspend)
    effects = tmp_path / "effects"
    key = f"d-{uuid.uuid4().hex[:8]}"
    result = call(served.server, "run", key, {"effects": str(effects)})
    assert result["status"] == "completed"
    assert result["replayed"], "the forced suspensions should have replayed steps"
    lines = effects.read_text().splitlines()
    assert Counter(line.split()[1] for line in lines) == Counter(ALL_CALLS)
    check_transcript(call(served.server, "transcript", key))
