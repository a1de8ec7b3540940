"""GPUBOT_ENFORCER=kubernetes: the official client against a loopback stub of the Kubernetes
API (tests/support/kube_stub.py) that records every request. Pods of a Kueue Workload have it
deactivated, other pods are evicted through the Eviction API (a PodDisruptionBudget's 429 is
tried again, never forced), a drain cordons; on SQLite and PostgreSQL, a reclaim and a drain
carried out by the sweep job's step and recorded in the audit."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from bot.enforcers import EnforcerUnavailableError, Order
from bot.enforcers.kubernetes import KubernetesEnforcer
from bot.services import Services
from bot.telemetry.model import ProcessInfo
from storage.db import Database
from tests.builders import default_sources
from tests.support.kube_stub import Cluster, a_node, a_pod, a_workload, serving
from tests.unit.bot.conftest import T0, Clock
from tests.unit.services.reclaiming import STARTED, audit, reclaimed

ADA = "U0ADMIN01"
NODE = "a100-node-01"
POD_A = "0b7c1d5a-2f4e-4b8c-9d1e-2f3a4b5c6d01"
POD_B = "0b7c1d5a-2f4e-4b8c-9d1e-2f3a4b5c6d02"
JOB = "5f0c0a00-0000-4000-8000-00000000cafe"
MERGE_PATCH = "application/merge-patch+json"


@pytest.fixture
def cluster() -> Cluster:
    return Cluster(nodes={NODE: a_node(NODE)})


@pytest.fixture
def kubeconfig(cluster: Cluster, tmp_path: Path) -> Iterator[Path]:
    with serving(cluster, tmp_path) as path:
        yield path


def an_order(*uids: str, progress: dict[str, object] | None = None) -> Order:
    targets = [
        {"gpu": k, "pod": uid, "pid": 4100 + k, "user": "alice"} for k, uid in enumerate(uids)
    ]
    return Order(1, 7, NODE, targets, term_grace_s=30, progress=progress or {})


# --- the contract: the calls and how their answers are read --------------------------------------


def test_pods_of_a_kueue_job_deactivate_its_workload_once(
    cluster: Cluster, kubeconfig: Path
) -> None:
    """Two pods of one Kueue-managed Job: the Workload labelled with the Job's uid is patched
    `spec.active=false` once, as a merge patch; no pod is evicted (its Job would remake it)."""
    labels = {"kueue.x-k8s.io/podset": "main"}
    cluster.pods += [
        a_pod("train-0", POD_A, NODE, owner_uid=JOB, labels=labels),
        a_pod("train-1", POD_B, NODE, owner_uid=JOB, labels=labels),
    ]
    cluster.workloads.append(a_workload("job-train-3f2a1", JOB))
    step = KubernetesEnforcer.connect(kubeconfig).reclaim(an_order(POD_A, POD_B), T0)

    assert (True, "") == (step.done, step.error)
    assert [
        ("GET", "/api/v1/pods"),
        ("GET", "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads"),
        ("PATCH", "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads/job-train-3f2a1"),
        ("GET", "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads"),
    ] == cluster.calls()
    listed, asked, patch = cluster.requests[:3]
    assert {"fieldSelector": f"spec.nodeName={NODE}"} == listed.query
    assert f"kueue.x-k8s.io/job-uid in ({POD_A},{JOB})" == asked.query["labelSelector"]
    assert (MERGE_PATCH, {"spec": {"active": False}}) == (patch.content_type, patch.body)
    assert False is cluster.workloads[0]["spec"]["active"]
    assert [
        {
            "pod": "ml/train-0",
            "uid": POD_A,
            "outcome": "deactivated",
            "workload": "job-train-3f2a1",
        },
        {
            "pod": "ml/train-1",
            "uid": POD_B,
            "outcome": "deactivated",
            "workload": "job-train-3f2a1",
        },
    ] == step.results


def test_a_pod_without_a_workload_is_evicted(cluster: Cluster, kubeconfig: Path) -> None:
    """A bare pod is evicted through policy/v1 Eviction without asking Kueue; a Job's pod
    where Kueue is not installed (404) is evicted too; a uid not on the node is `gone`."""
    cluster.pods += [a_pod("notebook", POD_A, NODE), a_pod("train-0", POD_B, NODE, owner_uid=JOB)]
    cluster.kueue = False
    step = KubernetesEnforcer.connect(kubeconfig).reclaim(an_order(POD_A, POD_B, "not-here"), T0)

    assert (True, "") == (step.done, step.error)
    assert [
        ("GET", "/api/v1/pods"),
        ("POST", "/api/v1/namespaces/ml/pods/notebook/eviction"),
        ("GET", "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads"),
        ("POST", "/api/v1/namespaces/ml/pods/train-0/eviction"),
    ] == cluster.calls()
    eviction = cluster.requests[1].body
    assert {"name": "notebook", "namespace": "ml"} == eviction["metadata"]
    assert {"evicted", "gone"} == {r["outcome"] for r in step.results}
    assert {"ml/notebook": "evicted", "ml/train-0": "evicted", "not-here": "gone"} == {
        r["pod"]: r["outcome"] for r in step.results
    }


def test_no_pod_listed_on_the_node_is_an_error_never_taken_for_gone(
    cluster: Cluster, kubeconfig: Path
) -> None:
    """Pods to end, yet Kubernetes lists none on the node (its name there differs from the
    bot's): the step fails with the likely cause and nothing is settled as gone."""
    step = KubernetesEnforcer.connect(kubeconfig).reclaim(an_order(POD_A), T0)

    assert not step.done
    assert "lists no pod on node 'a100-node-01'" in step.error
    assert [("GET", "/api/v1/pods")] == cluster.calls()
    assert [] == [r for r in step.results if r["outcome"] == "gone"]


def test_a_disruption_budget_refusal_is_tried_again_never_forced(
    cluster: Cluster, kubeconfig: Path
) -> None:
    """429: the order stays open with the PDB named, no DELETE is ever sent; the next step's
    eviction is allowed."""
    cluster.pods.append(a_pod("server", POD_A, NODE))
    cluster.refusals["server"] = 1
    enforcer = KubernetesEnforcer.connect(kubeconfig)
    first = enforcer.reclaim(an_order(POD_A), T0)
    assert (False, []) == (first.done, first.results)
    assert "PodDisruptionBudget" in first.error
    second = enforcer.reclaim(an_order(POD_A, progress=first.progress), T0 + timedelta(minutes=1))
    assert ([{"pod": "ml/server", "uid": POD_A, "outcome": "evicted"}], True) == (
        second.results,
        second.done,
    )
    assert [] == cluster.calls("DELETE")
    assert 2 == len(cluster.calls("POST"))


def test_a_drain_cordons_the_node(cluster: Cluster, kubeconfig: Path) -> None:
    """A merge patch of spec.unschedulable=true on the node; an unknown node is an error."""
    enforcer = KubernetesEnforcer.connect(kubeconfig)
    step = enforcer.drain(NODE, "gpubot: drained by U0ADMIN01")
    assert ([{"node": NODE, "outcome": "cordoned"}], True) == (step.results, step.done)
    (patch,) = cluster.requests
    assert ("PATCH", f"/api/v1/nodes/{NODE}") == (patch.method, patch.path)
    assert (MERGE_PATCH, {"spec": {"unschedulable": True}}) == (patch.content_type, patch.body)
    assert True is cluster.nodes[NODE]["spec"]["unschedulable"]
    missing = enforcer.drain("nowhere", "")
    assert (False, True) == (missing.done, missing.error.startswith("HTTP 404"))


def test_no_cluster_configuration_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPUBOT_KUBECONFIG naming no file, and no configuration at all, each say what to set."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(EnforcerUnavailableError, match=r"GPUBOT_KUBECONFIG is .*not a file"):
        KubernetesEnforcer.connect(tmp_path / "missing")
    with pytest.raises(EnforcerUnavailableError, match="found no cluster to talk to"):
        KubernetesEnforcer.connect(None)


# --- through the use cases, on SQLite and PostgreSQL ---------------------------------------------


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def services(database: Database, clock: Clock) -> Iterator[Services]:
    svc = Services.open(database, default_sources(), clock=clock, enforcer="kubernetes")
    yield svc
    svc.close()


def test_a_reclaim_evicts_the_holders_pod_after_commit(
    services: Services, clock: Clock, cluster: Cluster, kubeconfig: Path
) -> None:
    """The reclaim orders alice's pod only; the sweep job's step evicts it; `enforce:done`
    names the pod, the calls and the outcome."""
    cluster.pods += [a_pod("alice-train", POD_A, NODE), a_pod("bob-train", POD_B, NODE)]
    processes = (
        ProcessInfo(pid=4100, user="alice", job=f"pod/{POD_A}", started=STARTED),
        ProcessInfo(pid=4200, user="bob", job=f"pod/{POD_B}", started=STARTED),
    )
    reclaimed(services, clock, processes)
    assert [] == cluster.requests  # nothing inside the reclaim's transaction
    (ordered,) = audit(services, "enforce:ordered")
    assert "1 to evict" == ordered.outcome
    assert [POD_A] == [t["pod"] for t in ordered.detail["targets"]]

    assert 1 == len(services.enforce(kubeconfig))
    assert [("POST", "/api/v1/namespaces/ml/pods/alice-train/eviction")] == cluster.calls("POST")
    (done,) = audit(services, "enforce:done")
    assert ("enforcer:kubernetes", "evicted") == (done.actor, done.outcome)
    assert [{"pod": "ml/alice-train", "uid": POD_A, "outcome": "evicted"}] == done.detail["results"]
    assert "evict pod ml/alice-train: ok" in done.detail["commands"]
    assert [] == services.enforce(kubeconfig)


def test_an_admin_drain_cordons_the_node_and_an_unreachable_cluster_is_retried(
    services: Services, cluster: Cluster, kubeconfig: Path, tmp_path: Path
) -> None:
    """With no usable configuration the drain's try fails, recorded, and it waits; once the
    cluster can be reached, the node is cordoned and audited."""
    services.drain(ADA, NODE, "fan noise")
    (ordered,) = audit(services, "enforce:ordered")
    assert (f"node:{NODE}", "cordon") == (ordered.subject, ordered.outcome)
    broken = Services(services.db, services.ctx.live, services.ctx.clock, "kubernetes")
    assert [f"{NODE}: failed, retry 1 of 10"] == broken.enforce(tmp_path / "no-such-kubeconfig")
    assert [] == cluster.requests
    assert [f"{NODE}: cordoned"] == services.enforce(kubeconfig)
    assert True is cluster.nodes[NODE]["spec"]["unschedulable"]
    failed, cordoned = audit(services, "enforce:done")
    assert "GPUBOT_KUBECONFIG is" in failed.detail["error"]
    assert (f"node:{NODE}", "cordoned") == (cordoned.subject, cordoned.outcome)
