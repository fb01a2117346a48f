"""`pip install tether` without extras: the library works (SQLite runtime, scripted model, tools,
`tether run`), stays light, and every part that needs an extra says which one to install.

Each check runs in a fresh process through `programs/no_extras.py`, which makes every package of
`OPTIONAL` (what the extras bring) unimportable (a `sys.meta_path` finder), as if it had never
been installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tether._optional import DISTRIBUTIONS, EXTRA_MODULES, MissingExtraError, require_extra

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "tests" / "programs"
NO_EXTRAS = PROGRAMS / "no_extras.py"
CLERK = ROOT / "examples" / "release_clerk.yaml"
OPTIONAL = (
    "restate",
    "hypercorn",
    "fastapi",
    "starlette",
    "uvicorn",
    "prometheus_client",
    "aiohttp",
    "kopf",
    "anthropic",
    "openai",
    "kubernetes",
    "opentelemetry",
)


def sentence(part: str, extra: str, distribution: str) -> str:
    return (
        f"{part} requires the {extra} extra: pip install 'tether[{extra}]' "
        f"({distribution} is not installed)"
    )


def without_extras(*args: str) -> list[str]:
    """`programs/no_extras.py` refusing every package of `OPTIONAL`, then `args`."""
    return [str(NO_EXTRAS), f"--block={','.join(OPTIONAL)}", *args]


def python(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )


def test_import_tether_imports_no_optional_package() -> None:
    code = (
        "import sys, json, tether\n"
        "light = sorted({m.partition('.')[0] for m in sys.modules})\n"
        "import tether.agent, tether.durable, tether.session, tether.tools, tether.providers\n"
        "import tether.spec, tether.programs.cli, tether.programs.run\n"
        "core = sorted({m.partition('.')[0] for m in sys.modules})\n"
        "print(json.dumps([light, core]))\n"
    )
    done = python("-c", code)
    assert done.returncode == 0, done.stderr
    light, core = json.loads(done.stdout)
    assert not set(OPTIONAL) & set(light)
    assert not set(OPTIONAL) & set(core)


def test_an_agent_with_a_tool_runs_on_sqlite_without_any_extra(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    first = python(*without_extras(str(PROGRAMS / "tiny_agent.py"), db))
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert result["status"] == "completed"
    assert result["text"] == "Lisbon is sunny: walk to Belem."
    assert result["tool_calls"] == 1 and result["live"]["tool"] == 1
    # Run again: the finished run replays from its journal, nothing runs live.
    again = python(*without_extras(str(PROGRAMS / "tiny_agent.py"), db))
    assert again.returncode == 0, again.stderr
    replay = json.loads(again.stdout)
    assert replay["live"] == {} and replay["replayed"] == result["live"]


PARTS = {
    "tether.restate": sentence("tether.restate", "restate", "restate-sdk"),
    "tether.restate.runtime": sentence("tether.restate", "restate", "restate-sdk"),
    "tether.programs.worker": sentence("tether.programs.worker", "restate", "restate-sdk"),
    "tether.programs.worker.asgi": sentence("tether.programs.worker", "restate", "restate-sdk"),
    "tether.programs.sidecar": sentence("tether.programs.sidecar", "sidecar", "fastapi"),
    "tether.programs.sidecar.app": sentence("tether.programs.sidecar", "sidecar", "fastapi"),
    "tether.programs.metrics": sentence("tether.programs.metrics", "sidecar", "prometheus-client"),
    "tether.programs.tracing": sentence("tether.programs.tracing", "otel", "opentelemetry-sdk"),
    "tether.providers.anthropic_provider": sentence(
        "tether.providers.anthropic", "anthropic", "anthropic"
    ),
    "tether.providers.openai_provider": sentence("tether.providers.openai", "openai", "openai"),
    "tether_operator": sentence("tether_operator", "operator", "kopf"),
    "tether_operator.main": sentence("tether_operator", "operator", "kopf"),
}

PROBE = """
import importlib, json, sys
errors = {}
def caught(key, error):
    errors[key] = [type(error).__name__, str(error), error.name, error.__suppress_context__]
for part in sys.argv[1:]:
    try:
        importlib.import_module(part)
    except ImportError as error:
        caught(part, error)
for name in ("anthropic", "openai", "AnthropicProvider", "OpenAIProvider"):
    try:
        exec(f"from tether.providers import {name}")
    except ImportError as error:
        caught(f"from tether.providers import {name}", error)
print(json.dumps(errors))
"""


def test_each_optional_part_names_its_extra(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    done = python(*without_extras(str(probe), *PARTS))
    assert done.returncode == 0, done.stderr
    errors = json.loads(done.stdout)
    expected = {
        **PARTS,
        "from tether.providers import anthropic": PARTS["tether.providers.anthropic_provider"],
        "from tether.providers import AnthropicProvider": PARTS[
            "tether.providers.anthropic_provider"
        ],
        "from tether.providers import openai": PARTS["tether.providers.openai_provider"],
        "from tether.providers import OpenAIProvider": PARTS["tether.providers.openai_provider"],
    }
    assert {key: error[1] for key, error in errors.items()} == expected
    for kind, _, module, suppressed in errors.values():
        # A ModuleNotFoundError still (code that catches one keeps working), naming the module.
        assert kind == "MissingExtraError" and module in OPTIONAL and suppressed


def test_tether_run_works_without_any_extra(tmp_path: Path) -> None:
    (tmp_path / "CHANGELOG.md").write_text("# 1.4.0\n")
    state = {"XDG_STATE_HOME": str(tmp_path.with_name(f"{tmp_path.name}-state"))}
    args = ["run", str(CLERK), "--run-id", "t", "--prompt", "ship it", "--json"]
    done = python(*without_extras("-m", "tether", *args), cwd=tmp_path, env=state)
    assert done.returncode == 0, done.stderr
    assert "model: scripted" in done.stdout
    assert json.loads(done.stdout.splitlines()[-1])["stats"]["status"] == "completed"
    assert (tmp_path / "report.md").read_text() == "Release 1.4.0 is live and healthy.\n"
    # With a key for the manifest's provider, the run needs its SDK: one sentence, no traceback.
    args = ["run", str(CLERK), "--run-id", "t2", "--prompt", "ship it"]
    keyed = {**state, "ANTHROPIC_API_KEY": "sk-test"}
    refused = python(*without_extras("-m", "tether", *args), cwd=tmp_path, env=keyed)
    assert refused.returncode == 2
    assert "Traceback" not in refused.stderr
    expected = PARTS["tether.providers.anthropic_provider"]
    assert refused.stderr.strip() == f"tether: {expected}"


def test_tether_run_with_an_otlp_endpoint_names_the_otel_extra(tmp_path: Path) -> None:
    """Traces are off without an endpoint (the run above); with one, they need the extra."""
    (tmp_path / "CHANGELOG.md").write_text("# 1.4.0\n")
    env = {
        "XDG_STATE_HOME": str(tmp_path.with_name(f"{tmp_path.name}-state")),
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
    }
    args = ["run", str(CLERK), "--run-id", "t", "--prompt", "ship it"]
    refused = python(*without_extras("-m", "tether", *args), cwd=tmp_path, env=env)
    assert refused.returncode == 2
    assert refused.stderr.strip() == f"tether: {PARTS['tether.programs.tracing']}"


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["worker", "--spec", str(CLERK)], PARTS["tether.programs.worker"]),
        (["sidecar"], PARTS["tether.programs.sidecar"]),
        (["dev", "--spec", str(CLERK)], sentence("tether dev", "restate", "restate-sdk")),
    ],
)
def test_the_server_commands_name_their_extra(
    tmp_path: Path, command: list[str], expected: str
) -> None:
    env = {"TETHER_WEBHOOK_SECRET": "s", "ANTHROPIC_API_KEY": "sk-test"}
    done = python(*without_extras("-m", "tether", *command), cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert done.stderr.strip() == f"tether: {expected}"


def test_tether_worker_names_the_extra_of_the_manifests_provider(tmp_path: Path) -> None:
    env = {"TETHER_WEBHOOK_SECRET": "s", "ANTHROPIC_API_KEY": "sk-test"}
    command = ["-m", "tether", "worker", "--spec", str(CLERK)]
    done = python(str(NO_EXTRAS), "--block=anthropic", *command, cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert done.stderr.strip() == f"tether: {PARTS['tether.providers.anthropic_provider']}"


def test_require_extra_looks_the_modules_up() -> None:
    require_extra("tether.restate", "restate")  # installed here: nothing to say
    with pytest.raises(MissingExtraError) as raised:
        require_extra("tether.x", "restate", "restate", "no_such_module_of_tether")
    assert str(raised.value) == sentence("tether.x", "restate", "no_such_module_of_tether")
    assert isinstance(raised.value, ModuleNotFoundError)


def _name(requirement: str) -> str:
    return requirement.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip().lower()


def test_the_extras_table_matches_pyproject_and_the_dockerfile() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert set(EXTRA_MODULES) == set(extras) - {"dev"}
    for extra, modules in EXTRA_MODULES.items():
        names = {_name(requirement) for requirement in extras[extra]}
        # starlette comes with fastapi, which the sidecar's own code also imports.
        wanted = {DISTRIBUTIONS.get(module, module) for module in modules} - {"starlette"}
        assert wanted <= names, extra
    # The library itself needs none of them.
    core = {_name(requirement) for requirement in project["dependencies"]}
    assert not core & {DISTRIBUTIONS.get(module, module) for module in OPTIONAL}
    # `make test` and `make demo` install `.[dev]`; the image installs every extra but dev.
    assert f"tether[{','.join(EXTRA_MODULES)}]" in extras["dev"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"names = {list(EXTRA_MODULES)!r}" in dockerfile
