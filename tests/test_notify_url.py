"""`approvals.notify`: the URL comes from a Secret (`urlSecretRef`) through the worker's
environment; a URL with a token is refused in the manifest; no error repeats the value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tether.programs.worker.parking import host_of
from tether.programs.worker.settings import settings_from_env
from tether.secret_env import NOTIFY_URL_ENV
from tether.spec import SpecError, parse_agent
from tether_operator.render import sidecar_objects, version_objects
from tether_operator.settings import settings_from_env as operator_settings

TOKEN = "xT0kenT0kenT0kenT0kenT0ke"
SLACK_URL = f"https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/{TOKEN}"
FROM_SECRET = {"urlSecretRef": {"name": "slack", "key": "url"}}


def manifest(**notify: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "triage"},
        "spec": {
            "model": {
                "provider": "anthropic",
                "name": "c",
                "apiKeySecretRef": {"name": "llm", "key": "api-key"},
            },
            "tools": [{"name": "w", "builtin": "write_file", "requireApproval": True}],
            "approvals": {"notify": notify},
        },
    }


@pytest.mark.parametrize(
    "url",
    [
        SLACK_URL,
        f"https://example.com/hook?token={TOKEN}",
        f"https://bot:{TOKEN}@example.com/hook",
        f"https://discordapp.com/api/webhooks/1/{TOKEN}",
    ],
)
def test_a_url_with_a_token_is_refused_in_the_manifest(url: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_agent(manifest(url=url))
    message = str(refused.value)
    assert message.startswith("spec.approvals.notify.url: this URL carries a token")
    assert "urlSecretRef" in message and TOKEN not in message


@pytest.mark.parametrize(
    ("notify", "problem"),
    [
        ({}, "set `urlSecretRef`"),
        ({"url": "https://h.example/x", **FROM_SECRET}, "not both"),
        ({"url": "https://h.example/x", "urlEnv": "X"}, "not both"),
    ],
)
def test_the_url_has_one_source(notify: dict[str, Any], problem: str) -> None:
    with pytest.raises(SpecError, match=problem):
        parse_agent(manifest(**notify))


def _settings(tmp_path: Path, env: dict[str, str], **notify: Any) -> Any:
    spec = tmp_path / "agent.yaml"
    spec.write_text(yaml.safe_dump(manifest(**notify)))
    return settings_from_env({"TETHER_SPEC": str(spec), **env})


def test_the_worker_reads_the_url_from_its_environment(tmp_path: Path) -> None:
    settings = _settings(tmp_path, {NOTIFY_URL_ENV: SLACK_URL}, **FROM_SECRET)
    assert settings.notify_url == SLACK_URL
    assert NOTIFY_URL_ENV in settings.secret_variables  # redacted in its logs by value
    custom = _settings(tmp_path, {"SLACK_URL": SLACK_URL}, urlEnv="SLACK_URL")
    assert custom.notify_url == SLACK_URL and "SLACK_URL" in custom.secret_variables
    plain = _settings(tmp_path, {NOTIFY_URL_ENV: SLACK_URL}, url="http://approver.ops.svc/hook")
    assert plain.notify_url == "http://approver.ops.svc/hook"
    quiet = manifest()
    del quiet["spec"]["approvals"]
    (tmp_path / "quiet.yaml").write_text(yaml.safe_dump(quiet))
    env = {"TETHER_SPEC": str(tmp_path / "quiet.yaml"), NOTIFY_URL_ENV: SLACK_URL}
    assert settings_from_env(env).notify_url is None  # the manifest says whether to announce


def test_an_unset_or_bad_url_is_a_clear_error_that_does_not_repeat_it(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=f"{NOTIFY_URL_ENV} is not set.*urlSecretRef"):
        _settings(tmp_path, {}, **FROM_SECRET)
    with pytest.raises(SpecError) as bad:
        _settings(tmp_path, {NOTIFY_URL_ENV: f"ftp://x/{TOKEN}"}, **FROM_SECRET)
    assert "http:// or https://" in str(bad.value) and TOKEN not in str(bad.value)


def test_tether_worker_refuses_to_start_without_the_url(tmp_path: Path) -> None:
    spec = tmp_path / "agent.yaml"
    spec.write_text(yaml.safe_dump(manifest(**FROM_SECRET)))
    done = subprocess.run(
        [sys.executable, "-m", "tether", "worker", "--spec", str(spec), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "ANTHROPIC_API_KEY": "sk-test-not-real"},
    )
    assert done.returncode == 2, done.stderr
    assert f"{NOTIFY_URL_ENV} is not set" in done.stderr and "Traceback" not in done.stderr


def test_the_operator_maps_the_secret_and_keeps_the_url_out_of_the_config_map() -> None:
    settings = operator_settings(
        {
            "TETHER_RESTATE_ADMIN_URL": "http://restate.restate.svc:9070",
            "TETHER_RESTATE_INGRESS_URL": "http://restate.restate.svc:8080",
            "TETHER_WORKER_IMAGE": "ghcr.io/example/tether:1.0",
        }
    )
    for notify, variable in ((FROM_SECRET, NOTIFY_URL_ENV), ({**FROM_SECRET, "urlEnv": "U"}, "U")):
        agent = parse_agent(manifest(**notify))
        objects = version_objects(agent, "ops", settings)
        document = objects.config_map["data"]["agent.yaml"]
        assert yaml.safe_load(document)["spec"]["approvals"]["notify"] == notify
        [worker] = objects.deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in worker["env"]}
        assert env[variable] == {
            "name": variable,
            "valueFrom": {"secretKeyRef": {"name": "slack", "key": "url"}},
        }
        sidecar = sidecar_objects(agent, "ops", settings).deployment["spec"]["template"]["spec"]
        for container in sidecar["containers"]:  # the sidecar and the index send nothing
            assert variable not in {e["name"] for e in container["env"]}


def test_a_log_line_names_the_host_only() -> None:
    assert host_of(SLACK_URL) == "hooks.slack.com"
    assert host_of(f"http://bot:{TOKEN}@127.0.0.1:8080/x?token={TOKEN}") == "127.0.0.1:8080"
    assert host_of("http://[::1]:9/hook") == "[::1]:9"
