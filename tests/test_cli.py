"""`tether run` as a user runs it: a real process, real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tether.spec import SpecError, load_agent, parse_agent

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NO_KEYS = {"PATH": "/usr/bin:/bin"}


def tether(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=NO_KEYS,
    )


def test_run_the_example_with_the_scripted_model(tmp_path: Path) -> None:
    (tmp_path / "CHANGELOG.md").write_text("# 1.4.0\n")
    spec = str(EXAMPLES / "release_clerk.yaml")
    done = tether("run", spec, "--run-id", "t", "--prompt", "ship it", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "model: scripted" in done.stdout
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["stats"]["status"] == "completed"
    assert (tmp_path / "report.md").read_text() == "Release 1.4.0 is live and healthy.\n"
    # Running it again replays the finished run: nothing runs live, nothing is redone.
    again = tether("run", spec, "--run-id", "t", "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    replay = json.loads(again.stdout.splitlines()[-1])
    assert replay["live"] == {} and replay["stats"] == result["stats"]
    assert (tmp_path / "ledger.log").read_text().count("deploy 1.4.0 started") == 1


def test_an_invalid_manifest_is_a_clear_error_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: tether.dev/v1alpha1\nkind: DurableAgent\nmetadata: {name: x}\n"
        "spec:\n  model: {provider: anthropic, name: c}\n  tools: [{name: t, builtin: shell2}]\n"
    )
    done = tether("run", str(bad), "--run-id", "t", "--prompt", "p", cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "spec.tools[0].builtin" in done.stderr


def test_a_first_start_needs_a_prompt(tmp_path: Path) -> None:
    done = tether("run", str(EXAMPLES / "release_clerk.yaml"), "--run-id", "t", cwd=tmp_path)
    assert done.returncode == 2 and "--prompt is required" in done.stderr


INVALID = [
    ({"kind": "Agent"}, "kind"),
    ({"apiVersion": "v1"}, "apiVersion"),
    ({"metadata": {"name": "Bad_Name"}}, "metadata.name"),
    ({"spec": {"model": {"provider": "gemini", "name": "x"}}}, "spec.model.provider"),
    ({"spec": {"model": {"provider": "anthropic", "name": ""}}}, "spec.model.name"),
    ({"spec": {"model": {"provider": "anthropic", "name": "c", "maxTokens": 0}}}, "maxTokens"),
    ({"spec": {"model": {"provider": "scripted", "name": "s"}}}, "needs `script`"),
    (
        {"spec": {"model": {"provider": "anthropic", "name": "c"}, "limits": {"maxTurns": 0}}},
        "spec.limits.maxTurns",
    ),
    (
        {"spec": {"model": {"provider": "anthropic", "name": "c"}, "limits": {"maxCostUsd": -1}}},
        "spec.limits.maxCostUsd",
    ),
    ({"spec": {"model": {"provider": "anthropic", "name": "c"}, "limts": {}}}, "spec.limts"),
    (
        {
            "spec": {
                "model": {"provider": "anthropic", "name": "c"},
                "tools": [{"name": "a b", "builtin": "read_file"}],
            }
        },
        "spec.tools[0].name",
    ),
    (
        {"spec": {"model": {"provider": "anthropic", "name": "c"}, "tools": [{"name": "a"}]}},
        "exactly one of `builtin` or `python`",
    ),
    (
        {
            "spec": {
                "model": {"provider": "anthropic", "name": "c"},
                "tools": [{"name": "a", "python": "not a path"}],
            }
        },
        "spec.tools[0].python",
    ),
    (
        {
            "spec": {
                "model": {"provider": "anthropic", "name": "c"},
                "tools": [
                    {"name": "a", "builtin": "read_file"},
                    {"name": "a", "builtin": "list_files"},
                ],
            }
        },
        "repeated: a",
    ),
    (
        {
            "spec": {
                "model": {"provider": "anthropic", "name": "c"},
                "behavior": {"compactStrategy": "head"},
            }
        },
        "spec.behavior.compactStrategy",
    ),
    (
        {
            "spec": {
                "model": {"provider": "anthropic", "name": "c"},
                "tools": [{"name": "a", "builtin": "read_file", "timeout": "0s"}],
            }
        },
        "spec.tools[0].timeout",
    ),
]


@pytest.mark.parametrize(("change", "named"), INVALID)
def test_invalid_specs_name_the_field(change: dict[str, object], named: str) -> None:
    manifest: dict[str, object] = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "ok"},
        "spec": {"model": {"provider": "anthropic", "name": "c"}},
    }
    manifest.update(change)
    with pytest.raises(SpecError, match=named.replace("[", r"\[").replace("]", r"\]")):
        parse_agent(manifest)


def test_the_example_manifest_is_valid() -> None:
    agent = load_agent(EXAMPLES / "release_clerk.yaml")
    assert agent.metadata.name == "release-clerk"
    assert [t.name for t in agent.spec.tools][-1] == "check_health"
    assert agent.spec.model.pricing is not None and agent.spec.model.pricing.output_per_m_tok == 15


def test_a_worker_without_its_model_key_says_which_variable(tmp_path: Path) -> None:
    manifest = tmp_path / "agent.yaml"
    manifest.write_text(
        "apiVersion: tether.dev/v1alpha1\nkind: DurableAgent\nmetadata: {name: a}\n"
        "spec: {model: {provider: anthropic, name: claude-sonnet-4-5}}\n"
    )
    done = tether("worker", "--spec", str(manifest), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "tether: ANTHROPIC_API_KEY is not set: the worker needs the model's API key"
    )
