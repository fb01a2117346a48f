"""The admin calls both transports send (`tether.programs.restate_admin`): what each asks, and
what an answer means. The transports run against the real restate-server in the Restate and
operator tests."""

from __future__ import annotations

import pytest

from tether.programs import restate_admin as admin
from tether.programs.restate_admin import AdminRefused, parse_body, retry_delay


def test_register_forces_rediscovery_and_reads_the_deployment_id() -> None:
    call = admin.register("http://w:9080", metadata={"tether.dev/version": "abc"})
    assert (call.method, call.path) == ("POST", "/deployments")
    assert call.payload == {
        "uri": "http://w:9080",
        "force": True,
        "metadata": {"tether.dev/version": "abc"},
    }
    assert call.answer(201, {"id": "dp_1", "services": []}) == "dp_1"
    assert "metadata" not in admin.register("http://w:9080").payload


def test_a_refusal_names_the_call_restates_code_and_a_condition_reason() -> None:
    body = {"message": "[META0003] got status code 404", "restate_code": "META0003"}
    with pytest.raises(AdminRefused) as refused:
        admin.register("http://w:9080").answer(500, body)
    assert refused.value.code == admin.STILL_STARTING
    assert (refused.value.status, refused.value.failure) == (500, "RegistrationFailed")
    assert "registering http://w:9080 failed: HTTP 500: [META0003]" in str(refused.value)
    with pytest.raises(AdminRefused, match="SQL introspection failed: HTTP 400: <html>") as bad:
        admin.query("SELECT 1").answer(400, "<html>")  # a proxy's page, not JSON
    assert (bad.value.code, bad.value.failure) == (None, "QueryFailed")


def test_a_deployment_already_gone_is_removed() -> None:
    call = admin.unregister("dp_1")
    assert (call.method, call.path) == ("DELETE", "/deployments/dp_1?force=true")
    assert call.answer(404, {"message": "not found"}) is None
    with pytest.raises(AdminRefused, match="removing deployment dp_1 failed"):
        call.answer(500, None)


def test_rows_and_deployments_are_read_from_their_envelopes() -> None:
    assert admin.query("SELECT 1").answer(200, {"rows": [{"n": 1}]}) == [{"n": 1}]
    assert admin.query("SELECT 1").answer(200, {}) == []
    assert admin.deployments().answer(200, {"deployments": [{"id": "dp"}]}) == [{"id": "dp"}]


def test_only_a_busy_restate_is_asked_again() -> None:
    assert retry_delay(503, {"Retry-After": "3"}, 0.5) == 3.0
    assert retry_delay(429, {"retry-after": "soon"}, 0.5) == 0.5
    assert retry_delay(500, {}, 0.5) is None and retry_delay(200, {}, 0.5) is None
    assert parse_body(b'{"id": "x"}') == {"id": "x"}
    assert parse_body("") is None and parse_body(b"oops") == "oops"
