"""A worker that serves only the index (`tether worker --serve index`) loads nothing of the agent's
loop and is given none of the agent's secrets; the real processes are in
`tests/restate/test_worker_roles.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tether.programs.gc_tuning import YOUNG_THRESHOLD
from tether.programs.restate_identity import IDENTITY_KEYS_ENV
from tether.programs.worker.settings import settings_from_env, without_agent_secrets
from tether.secret_env import NOTIFY_URL_ENV, PREVIOUS_SECRET_ENV

LOOP = (
    "tether.agent",
    "tether.providers",
    "tether.tools",
    "tether.restate",
    "tether.spec.assemble",
    "tether.programs.worker.services",
)


def write_spec(directory: Path) -> Path:
    """An agent whose runs need a model key (in `MODEL_KEY`) and a notify URL."""
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "a"},
        "spec": {
            "model": {"provider": "anthropic", "name": "c", "apiKeyEnv": "MODEL_KEY"},
            "tools": [{"name": "w", "builtin": "write_file", "requireApproval": True}],
            "approvals": {"notify": {"urlSecretRef": {"name": "n", "key": "url"}}},
        },
    }
    path = directory / "a.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run_index_code(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter set up as an index worker's (no model key, no notify URL)."""
    env = {
        "PATH": os.environ["PATH"],
        "TETHER_SPEC": str(write_spec(tmp_path)),
        "TETHER_WORKER_SERVES": "index",
        "TETHER_WEBHOOK_SECRET": "s" * 32,
    }
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )


def test_an_index_loads_nothing_of_the_agent_loop(tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "from tether.programs.worker.settings import settings_from_env\n"
        "from tether.programs.worker.served import served_services\n"
        "names = [service.name for service in served_services(settings_from_env())]\n"
        "print(json.dumps([names, sorted(m for m in sys.modules if m.startswith('tether'))]))"
    )
    done = run_index_code(code, tmp_path)
    names, loaded = json.loads(done.stdout)
    assert names == [
        "a-parked",
        "a-live",
        "a-watchers",
        "a-inbox",
        "a-handoff",
        "a-pace",
        "a-schedule",
        "a-spend",
    ]
    assert not [m for m in loaded if m.startswith(LOOP)], loaded


def test_an_index_is_given_only_the_webhook_secrets_and_restates_keys(tmp_path: Path) -> None:
    kept = {
        "TETHER_SPEC": str(write_spec(tmp_path)),
        "TETHER_WORKER_SERVES": "index",
        "TETHER_WEBHOOK_SECRET": "s" * 32,
        PREVIOUS_SECRET_ENV: "p" * 32,
        IDENTITY_KEYS_ENV: "publickeyv1_x",
        "PATH": "/usr/bin",
    }
    agents = {
        "MODEL_KEY": "k1",
        "ANTHROPIC_API_KEY": "k2",
        "OPENAI_API_KEY": "k3",
        NOTIFY_URL_ENV: "https://hooks.example/x",
    }
    assert without_agent_secrets(settings_from_env({**kept, **agents})) == kept


def test_the_worker_freezes_what_it_loaded_before_serving(tmp_path: Path) -> None:
    """The worker's app module leaves its import-time heap to no garbage collection, and
    collects its young objects less often than Python's default."""
    code = (
        "import gc\n"
        "before = gc.get_freeze_count()\n"
        "import tether.programs.worker.asgi\n"
        "print(before, gc.get_freeze_count(), gc.get_threshold()[0])"
    )
    done = run_index_code(code, tmp_path)
    before, after, young = map(int, done.stdout.split())
    assert before == 0 and after > 10_000, done.stdout
    assert young == YOUNG_THRESHOLD
