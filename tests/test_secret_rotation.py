"""Rotating the webhook secret without downtime: while `spec.webhook.previousSecretRef` names the
key being replaced, what was signed with it (webhooks, links, pages rendered before) is still
accepted, and only the new key signs. Without it, the old key is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
import yaml

from tests.test_sidecar import (
    AGENT,
    ID_A,
    SECRET,
    FakeRestate,
    answered,
    settings,
)
from tether.programs.sidecar import create_app, settings_from_env
from tether.programs.webhooks import (
    SignatureError,
    answer_proof,
    listing_token,
    sign_request,
    signed_link,
    verified_by_any,
    verify_answer_proof,
)
from tether.secret_env import PREVIOUS_SECRET_ENV
from tether.spec import parse_agent
from tether_operator.render import sidecar_objects, version_objects
from tether_operator.settings import settings_from_env as operator_settings

OLD = "the-key-being-replaced-now"


@pytest.fixture
async def rotating(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[httpx2.AsyncClient, FakeRestate]]:
    """The sidecar with `SECRET` as its key, and `OLD` as the previous one when asked."""
    restate = await FakeRestate().start()
    restate.park(ID_A, "session-1")
    previous = {"previous_webhook_secret": OLD} if request.param else {}
    app = create_app(settings(restate_ingress_url=restate.ingress, **previous))
    transport = httpx2.ASGITransport(app=app)
    try:
        async with httpx2.AsyncClient(transport=transport, base_url="http://sidecar.test") as c:
            yield c, restate
    finally:
        await app.state.sidecar.restate.close()
        await restate.stop()


def signed_post(key: str) -> tuple[str, bytes, dict[str, str]]:
    path, body = f"/v1/awakeables/{ID_A}/resolve", b'{"approved": true}'
    headers = {**sign_request(key.encode(), body, path=path), "content-type": "application/json"}
    return path, body, headers


@pytest.mark.parametrize("rotating", [True], indirect=True)
async def test_during_a_rotation_the_old_key_is_accepted_and_the_new_one_signs(
    rotating: tuple[httpx2.AsyncClient, FakeRestate],
) -> None:
    client, restate = rotating
    path, body, headers = signed_post(OLD)
    accepted = await client.post(path, content=body, headers=headers)
    assert accepted.status_code == 202, accepted.text
    [sent] = restate.completions
    assert answered(sent) == {"awakeable_id": ID_A, "value": {"approved": True}}
    # The proof the worker checks is made with the new key (the fake checks it with SECRET).
    content = yaml.safe_load(sent.content)
    proof = answer_proof(SECRET.encode(), ID_A, {"value": {"approved": True}})
    assert content["proof"] == proof
    # Listing tokens too: the fake Restate verified the sidecar's with SECRET.
    assert restate.queries >= 1


@pytest.mark.parametrize("rotating", [True], indirect=True)
async def test_a_link_minted_with_the_old_key_still_opens_and_decides(
    rotating: tuple[httpx2.AsyncClient, FakeRestate],
) -> None:
    client, restate = rotating
    url = signed_link("http://sidecar.test", OLD.encode(), "approve", ID_A, 4_000_000_000)
    page = await client.get(url.removeprefix("http://sidecar.test"))
    assert page.status_code == 200 and "Approve" in page.text
    assert restate.completions == []


@pytest.mark.parametrize("rotating", [False], indirect=True)
async def test_after_the_rotation_the_old_key_is_refused(
    rotating: tuple[httpx2.AsyncClient, FakeRestate],
) -> None:
    client, restate = rotating
    path, body, headers = signed_post(OLD)
    refused = await client.post(path, content=body, headers=headers)
    assert refused.status_code == 401, refused.text
    assert restate.completions == []


def test_the_worker_side_accepts_either_key_and_only_those() -> None:
    answer: dict[str, Any] = {"value": {"approved": True}}
    keys = (SECRET.encode(), OLD.encode())
    for key in keys:
        proof = answer_proof(key, ID_A, answer)
        verified_by_any(keys, verify_answer_proof, ID_A, answer, proof)
    stranger = answer_proof(b"someone-else-entirely", ID_A, answer)
    with pytest.raises(SignatureError):
        verified_by_any(keys, verify_answer_proof, ID_A, answer, stranger)
    with pytest.raises(SignatureError):
        verified_by_any((), verify_answer_proof, ID_A, answer, stranger)
    assert listing_token(OLD.encode())["sig"] != listing_token(SECRET.encode())["sig"]


def test_the_previous_key_reaches_every_container_from_its_secret() -> None:
    settings = operator_settings(
        {
            "TETHER_RESTATE_ADMIN_URL": "http://restate.restate.svc:9070",
            "TETHER_RESTATE_INGRESS_URL": "http://restate.restate.svc:8080",
            "TETHER_WORKER_IMAGE": "ghcr.io/example/tether:1.0",
        }
    )
    webhook = {
        "secretRef": {"name": "hooks", "key": "new"},
        "previousSecretRef": {"name": "hooks", "key": "old"},
    }
    agent = parse_agent(
        {
            "apiVersion": "tether.dev/v1alpha1",
            "kind": "DurableAgent",
            "metadata": {"name": AGENT},
            "spec": {
                "model": {"provider": "scripted", "name": "s", "script": [{"text": "hi"}]},
                "webhook": webhook,
            },
        }
    )
    objects = version_objects(agent, "ops", settings)
    sidecar = sidecar_objects(agent, "ops", settings)
    pods = [objects.deployment["spec"]["template"], sidecar.deployment["spec"]["template"]]
    containers = [c for pod in pods for c in pod["spec"]["containers"]]
    assert [c["name"] for c in containers] == ["worker", "sidecar", "index"]
    for container in containers:
        env = {e["name"]: e for e in container["env"]}
        assert env[PREVIOUS_SECRET_ENV]["valueFrom"] == {
            "secretKeyRef": {"name": "hooks", "key": "old"}
        }
    for config_map in (objects.config_map, sidecar.config_map):
        assert "old" not in config_map["data"]["agent.yaml"].replace("key: old", "")


def test_the_sidecar_reads_the_previous_key_from_its_environment() -> None:
    env = {
        "RESTATE_INGRESS_URL": "http://restate:8080",
        "TETHER_AGENT": AGENT,
        "TETHER_WEBHOOK_SECRET": SECRET,
        PREVIOUS_SECRET_ENV: OLD,
    }
    loaded = settings_from_env(env)
    assert loaded.secrets == (SECRET.encode(), OLD.encode())
    assert OLD not in repr(loaded)
