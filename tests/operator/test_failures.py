"""Input the schema accepts but the operator cannot serve, and a Restate it cannot reach: a
condition with a clear reason, retries with backoff, no crash, no working version removed."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from tests.operator.op_harness import Cluster, OperatorFactory, Restate, free_port, wait_for
from tests.operator.test_children import (
    AGENT,
    NOTIFY,
    SLACK_TOKEN,
    SLACK_URL,
    manifest,
    registered,
    with_secrets,
)


def condition_with_reason(cluster: Cluster, kind: str, reason: str) -> dict[str, Any]:
    """The agent's `kind` condition once its reason is `reason`."""
    return wait_for(
        lambda: (c := cluster.condition(AGENT, kind)).get("reason") == reason and c,
        timeout=60,
        what=f"{kind} with reason {reason} in {cluster.namespace}",
    )


def test_a_missing_secret_is_a_condition_until_it_exists(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    operator = run_operator(entry="module")  # `python -m tether_operator`, as tether-operator
    cluster.apply_agent(manifest())
    blocked = condition_with_reason(cluster, "Progressing", "SecretNotFound")
    assert blocked["status"] == "False"
    assert (
        f"Secret {cluster.namespace}/llm named by spec.model.apiKeySecretRef" in blocked["message"]
    )
    assert "kubectl" in blocked["message"]
    status = cluster.status(AGENT)
    assert status["phase"] == "Degraded"
    assert cluster.condition(AGENT, "Ready")["status"] == "False"
    assert cluster.child_names(AGENT)["deployments"] == set()
    assert any(
        e["type"] == "Warning" and e["reason"] == "SecretNotFound" for e in cluster.events(AGENT)
    )
    assert operator.healthy()

    with_secrets(cluster)
    wait_for(lambda: registered(cluster), timeout=60, what="Registered after the Secret exists")
    assert cluster.status(AGENT)["phase"] == "Ready"


def test_a_missing_notify_secret_is_a_condition_until_it_exists(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    """The Secret of `approvals.notify.urlSecretRef` is checked like the others: missing, or
    without its key, it is `SecretNotFound` naming the field, and nothing is deployed."""
    with_secrets(cluster)
    run_operator()
    cluster.apply_agent(manifest(approvals=NOTIFY))
    blocked = condition_with_reason(cluster, "Progressing", "SecretNotFound")
    assert blocked["status"] == "False"
    assert (
        f"Secret {cluster.namespace}/slack named by spec.approvals.notify.urlSecretRef does not "
        "exist" in blocked["message"]
    )
    assert "kubectl" in blocked["message"]
    assert cluster.status(AGENT)["phase"] == "Degraded"
    assert cluster.child_names(AGENT)["deployments"] == set()
    assert any(
        e["type"] == "Warning" and e["reason"] == "SecretNotFound" for e in cluster.events(AGENT)
    )

    # There, but with the URL under another key: the condition says which key it wants.
    cluster.secret("slack", {"webhook": SLACK_URL})
    wait_for(
        lambda: "has no key 'url'" in cluster.condition(AGENT, "Progressing").get("message", ""),
        timeout=60,
        what="the condition to name the missing key",
    )
    assert SLACK_TOKEN not in str([cluster.agent(AGENT), cluster.events(AGENT)])

    cluster.core.delete_namespaced_secret("slack", cluster.namespace)
    cluster.secret("slack", {"url": SLACK_URL})
    wait_for(lambda: registered(cluster), timeout=60, what="Registered after the Secret is right")
    assert cluster.status(AGENT)["phase"] == "Ready"


def test_a_change_that_cannot_roll_out_keeps_the_working_version(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    with_secrets(cluster)
    run_operator()
    cluster.apply_agent(manifest())
    wait_for(lambda: registered(cluster), timeout=60, what="Registered=True")
    working = cluster.status(AGENT)["activeVersion"]

    cluster.apply_agent(manifest(webhook={"secretRef": {"name": "missing", "key": "k"}}))
    condition_with_reason(cluster, "Progressing", "SecretNotFound")
    status = cluster.status(AGENT)
    assert status["activeVersion"] == working and status["phase"] == "Degraded"
    assert cluster.condition(AGENT, "Ready")["status"] == "True"
    assert [v["hash"] for v in status["versions"]] == [working]
    assert restate.call(AGENT, "still", "up?")["version"] == working


def test_an_unreachable_restate_is_a_condition_and_nothing_is_removed(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    with_secrets(cluster)
    first = run_operator()
    cluster.apply_agent(manifest(system="v1"))
    wait_for(lambda: registered(cluster), timeout=60, what="v1 registered")
    working = cluster.status(AGENT)["activeVersion"]
    working_id = cluster.versions(AGENT)[0]["restateDeploymentId"]
    first.process.stop()

    # Restate's admin API moves out of reach; the spec changes meanwhile.
    dead = f"http://127.0.0.1:{free_port()}"
    blind = run_operator(TETHER_RESTATE_ADMIN_URL=dead)
    cluster.apply_agent(manifest(system="v2"))
    unreachable = condition_with_reason(cluster, "Registered", "RestateUnreachable")
    assert dead in unreachable["message"]
    status = cluster.status(AGENT)
    assert status["phase"] == "Degraded" and status["activeVersion"] == working
    assert cluster.condition(AGENT, "Ready")["status"] == "True"
    assert f"{AGENT}-{working}" in cluster.child_names(AGENT)["deployments"]
    assert working_id in restate.deployments()
    assert blind.healthy()
    assert any(e["reason"] == "RestateUnreachable" for e in cluster.events(AGENT))
    blind.process.stop()

    # Back in reach: the new version registers, the old one drains and goes.
    run_operator()
    wait_for(
        lambda: (
            (s := cluster.status(AGENT)).get("activeVersion") not in (None, working)
            and len(s.get("versions", [])) == 1
        ),
        timeout=60,
        what="v2 active and v1 retired",
    )
    assert working_id not in restate.deployments()


def test_an_agent_name_taken_in_another_namespace_is_a_condition(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    """Restate's service names are flat: the same agent name in a second namespace must not take
    the service (and so the runs) of the first; it waits, with a condition, until the name is
    free."""
    other = Cluster(cluster.api, f"{cluster.namespace}-b")
    client.CoreV1Api(cluster.api).create_namespace(
        client.V1Namespace.model_validate({"metadata": {"name": other.namespace}})
    )
    try:
        with_secrets(cluster), with_secrets(other)
        # One operator for both namespaces (`tether-operator` reads TETHER_NAMESPACES).
        run_operator(entry="module", TETHER_NAMESPACES=f"{cluster.namespace},{other.namespace}")
        cluster.apply_agent(manifest(system="first"))
        wait_for(lambda: registered(cluster), timeout=60, what="the first agent registered")
        first_version = cluster.status(AGENT)["activeVersion"]

        other.apply_agent(manifest(system="second"))
        taken = condition_with_reason(other, "Registered", "ServiceNameTaken")
        assert f"DurableAgent {cluster.namespace}/{AGENT}" in taken["message"]
        assert "another name" in taken["message"]
        assert any(e["reason"] == "ServiceNameTaken" for e in other.events(AGENT))
        assert other.status(AGENT)["phase"] == "Degraded"
        # The first agent keeps its service: its version still serves the runs.
        assert registered(cluster)
        assert restate.call(AGENT, "s1", "who?")["version"] == first_version
        assert restate.deployments_of(other.namespace, AGENT) == set()

        # Once the first agent is gone, the name is free and the second one registers.
        cluster.delete_agent(AGENT)
        wait_for(lambda: cluster.agent(AGENT) is None, timeout=60, what="the first agent deleted")
        wait_for(lambda: registered(other), timeout=90, what="the second agent registered")
        second_version = other.status(AGENT)["activeVersion"]
        assert restate.call(AGENT, "s2", "who?")["version"] == second_version
    finally:
        for name in other.agents():
            restate.kill_runs(name)
            other.delete_agent(name)
        wait_for(lambda: not other.agents(), timeout=60, what="the second agent deleted")
        client.CoreV1Api(cluster.api).delete_namespace(other.namespace)


def test_a_version_is_registered_once_its_url_answers(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    """Its pods are ready before the Service routes to them: the operator waits for the URL to
    answer instead of sending Restate a registration that fails; if it never answers (the
    operator may be kept from the workers where Restate is not), it registers after a while."""
    with_secrets(cluster)
    closed = free_port()
    run_operator(TETHER_WORKER_URL_TEMPLATE=f"http://127.0.0.1:{closed}/{{namespace}}/{{agent}}")
    cluster.apply_agent(manifest())
    waiting = condition_with_reason(cluster, "Registered", "WaitingForService")
    assert "does not answer yet" in waiting["message"]
    assert not any(e["reason"] == "RegistrationFailed" for e in cluster.events(AGENT))
    # Restate is asked after ROUTE_WAIT (10 s), and says why it cannot register it.
    failed = condition_with_reason(cluster, "Registered", "RegistrationFailed")
    assert str(closed) in failed["message"]


def test_a_fallback_models_secret_is_checked_and_reaches_the_worker_only(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    fallback = {
        "provider": "openai",
        "name": "gpt-4o",
        "apiKeySecretRef": {"name": "llm-fallback", "key": "api-key"},
    }
    body = manifest()
    body["spec"]["model"]["fallbacks"] = [fallback]
    with_secrets(cluster)
    run_operator()
    cluster.apply_agent(body)
    blocked = condition_with_reason(cluster, "Progressing", "SecretNotFound")
    assert (
        f"Secret {cluster.namespace}/llm-fallback named by "
        "spec.model.fallbacks[0].apiKeySecretRef" in blocked["message"]
    )
    assert cluster.child_names(AGENT)["deployments"] == set()

    cluster.secret("llm-fallback", {"api-key": "sk-fallback-not-real"})
    wait_for(lambda: registered(cluster), timeout=60, what="Registered after the Secret exists")
    [version] = cluster.status(AGENT)["versions"]

    def containers(name: str) -> list[Any]:
        deployment = cluster.apps.read_namespaced_deployment(name, cluster.namespace)
        return list(deployment.spec.template.spec.containers)

    worker = containers(f"{AGENT}-{version['hash']}")
    sidecar = containers(f"{AGENT}-sidecar")
    worker_env = {e.name: e for e in worker[0].env}
    refs = {
        name: (
            worker_env[name].value_from.secret_key_ref.name,
            worker_env[name].value_from.secret_key_ref.key,
        )
        for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
    }
    assert refs == {
        "ANTHROPIC_API_KEY": ("llm", "api-key"),
        "OPENAI_API_KEY": ("llm-fallback", "api-key"),
    }
    for container in sidecar:  # the sidecar's pods run no model and no tool
        assert not {"ANTHROPIC_API_KEY", "OPENAI_API_KEY"} & {e.name for e in container.env}
