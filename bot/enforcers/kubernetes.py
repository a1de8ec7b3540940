"""GPUBOT_ENFORCER=kubernetes: a reclaim evicts the holder's pods on the lease's GPUs, or
deactivates their Kueue Workload; a drain cordons the node. Through the official client:

    GET   /api/v1/pods?fieldSelector=spec.nodeName=NODE       the pod each process's uid names
    GET   .../namespaces/NS/workloads?labelSelector=kueue.x-k8s.io/job-uid in (...)
          the Workload Kueue made for the pod or for the Job that owns it
    PATCH .../namespaces/NS/workloads/NAME  {"spec": {"active": false}}
          Kueue evicts the workload's pods and keeps it out of the queue until reactivated;
          evicting one pod would only have its Job make another
    POST  /api/v1/namespaces/NS/pods/NAME/eviction
          the Eviction API honours PodDisruptionBudgets: a 429 is "not now", tried again at
          the next sweep, never forced by a delete
    PATCH /api/v1/nodes/NODE  {"spec": {"unschedulable": true}}   the cordon

The client is an optional extra (`pip install 'gpubot[kubernetes]'`), imported on first use.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from bot.enforcers.model import KUBERNETES, EnforcerUnavailableError, Order, Step, shorten

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"
JOB_UID = "kueue.x-k8s.io/job-uid"  # the label Kueue puts on a Workload: its owner's uid
MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT_S = 15.0

GONE = "gone"  # no such pod on the node (any more)
EVICTED = "evicted"  # the Eviction API accepted: the pod stops within its grace period
DEACTIVATED = "deactivated"  # its Kueue Workload is inactive: Kueue evicts its pods


def _modules() -> tuple[Any, Any, Any]:
    """The client's `client`, `config` and `exceptions` modules, untyped where they are."""
    try:
        return (
            importlib.import_module("kubernetes.client"),
            importlib.import_module("kubernetes.config"),
            importlib.import_module("kubernetes.client.exceptions"),
        )
    except ImportError as exc:
        raise EnforcerUnavailableError(
            "GPUBOT_ENFORCER=kubernetes needs the official Kubernetes client, which is not "
            "installed: pip install 'gpubot[kubernetes]'"
        ) from exc


def _api_client(client: Any, config: Any, kubeconfig: Path | None) -> Any:
    """An ApiClient from GPUBOT_KUBECONFIG, else the pod's service account, else
    ~/.kube/config."""
    default = Path.home() / ".kube" / "config"
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise EnforcerUnavailableError(
                f"GPUBOT_KUBECONFIG is {kubeconfig}, which is not a file: point it at the "
                "kubeconfig the bot should use, or unset it inside the cluster"
            )
        where = f"GPUBOT_KUBECONFIG={kubeconfig}"
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        where = "the pod's service account"
    elif default.is_file():
        where = str(default)
    else:
        raise EnforcerUnavailableError(
            "GPUBOT_ENFORCER=kubernetes found no cluster to talk to: set GPUBOT_KUBECONFIG to "
            f"a kubeconfig file, or run the bot in a pod with a service account ({default} "
            "does not exist either)"
        )
    try:
        if where == "the pod's service account":
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        return config.new_client_from_config(config_file=str(kubeconfig or default))
    except Exception as exc:  # the loaders raise their own errors, yaml's and OSError
        raise EnforcerUnavailableError(
            f"the Kubernetes configuration from {where} cannot be used: {shorten(str(exc))}"
        ) from exc


class KubernetesEnforcer:
    """Evicts pods, deactivates Kueue Workloads and cordons nodes."""

    name = KUBERNETES

    def __init__(self, api_client: Any, client: Any, exceptions: Any) -> None:
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self._client = client
        self._api_error: type[Exception] = exceptions.ApiException
        # What a call may raise short of an answer: the connection, TLS, a timeout.
        self._failures: tuple[type[Exception], ...] = (
            exceptions.ApiException,
            importlib.import_module("urllib3.exceptions").HTTPError,
            OSError,
        )

    @classmethod
    def connect(cls, kubeconfig: Path | None = None) -> KubernetesEnforcer:
        client, config, exceptions = _modules()
        return cls(_api_client(client, config, kubeconfig), client, exceptions)

    def reclaim(self, order: Order, now: datetime) -> Step:
        settled: dict[str, str] = dict(order.progress.get("pods", {}))
        names: dict[str, str] = dict(order.progress.get("names", {}))
        owned: dict[str, str] = dict(order.progress.get("owned", {}))  # uid -> its workload
        deactivated: list[str] = list(order.progress.get("workloads", []))
        uids = [
            uid
            for uid in dict.fromkeys(str(t["pod"]) for t in order.targets if t.get("pod"))
            if uid not in settled
        ]
        commands: list[str] = []
        errors: list[str] = []
        pods: dict[str, Any] = {}
        if uids:
            listed = self._call(
                f"list pods on {order.node}",
                commands,
                lambda: self.core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={order.node}",
                    _request_timeout=REQUEST_TIMEOUT_S,
                ),
            )
            if isinstance(listed, str):
                errors.append(f"list pods on {order.node}: {listed}")
                uids = []
            elif not listed.items:
                # The node's processes are in pods, yet Kubernetes lists none on it: most
                # likely the bot's node name is not the Kubernetes node name (a short name
                # against a fully qualified one). Nothing is taken for gone on that evidence.
                errors.append(
                    f"Kubernetes lists no pod on node {order.node!r}: is that the node's name "
                    "in Kubernetes (kubectl get nodes)? pools.yaml and the agent must use it"
                )
                uids = []
            else:
                pods = {pod.metadata.uid: pod for pod in listed.items or []}
        for uid in uids:
            pod = pods.get(uid)
            if pod is None:
                settled[uid] = GONE
                continue
            names[uid] = f"{pod.metadata.namespace}/{pod.metadata.name}"
            outcome, workload = self._end(pod, deactivated, commands)
            if outcome.startswith("error: "):
                errors.append(f"pod {names[uid]}: {outcome.removeprefix('error: ')}")
            else:
                settled[uid] = outcome
            if workload:
                owned[uid] = workload
        results = [
            {"pod": names.get(uid, uid), "uid": uid, "outcome": outcome}
            | ({"workload": owned[uid]} if uid in owned else {})
            for uid, outcome in settled.items()
        ]
        progress = {"pods": settled, "names": names, "owned": owned, "workloads": deactivated}
        return Step(results, commands, not errors, "; ".join(errors), progress)

    def _end(self, pod: Any, deactivated: list[str], commands: list[str]) -> tuple[str, str]:
        """Deactivate the pod's Workload, else evict the pod: (the outcome, or `error: why`;
        the workload's name, "" when it has none)."""
        namespace, name = pod.metadata.namespace, pod.metadata.name
        workload = self._workload_of(pod, commands)
        if workload.startswith("error: "):
            return workload, ""
        if workload:
            key = f"{namespace}/{workload}"
            if key not in deactivated:  # several pods of one workload: one patch
                patched = self._call(
                    f"patch workload {key} spec.active=false",
                    commands,
                    lambda: self.custom.patch_namespaced_custom_object(
                        KUEUE_GROUP,
                        KUEUE_VERSION,
                        namespace,
                        "workloads",
                        workload,
                        {"spec": {"active": False}},
                        _content_type=MERGE_PATCH,
                        _request_timeout=REQUEST_TIMEOUT_S,
                    ),
                    missing=GONE,
                )
                if patched == GONE:
                    return GONE, workload  # deleted meanwhile, and its pods with it
                if isinstance(patched, str):
                    return f"error: {patched}", workload
                deactivated.append(key)
            return DEACTIVATED, workload
        body = self._client.V1Eviction(
            metadata=self._client.V1ObjectMeta(name=name, namespace=namespace)
        )
        evicted = self._call(
            f"evict pod {namespace}/{name}",
            commands,
            lambda: self.core.create_namespaced_pod_eviction(
                name, namespace, body, _request_timeout=REQUEST_TIMEOUT_S
            ),
            missing=GONE,
        )
        if evicted == GONE:
            return GONE, ""
        return (f"error: {evicted}" if isinstance(evicted, str) else EVICTED), ""

    def _workload_of(self, pod: Any, commands: list[str]) -> str:
        """The name of the Kueue Workload the pod belongs to (its own, or its owner Job's);
        "" when it has none; `error: why` when that could not be asked."""
        meta = pod.metadata
        marked = any(
            key.startswith(f"{KUEUE_GROUP}/")
            for key in [*(meta.labels or {}), *(meta.annotations or {})]
        )
        owners = [owner.uid for owner in meta.owner_references or [] if owner.uid]
        if not marked and not owners:
            return ""  # a bare pod Kueue never saw: nothing to ask
        selector = f"{JOB_UID} in ({','.join([meta.uid, *owners])})"
        found = self._call(
            f"list workloads in {meta.namespace} ({selector})",
            commands,
            lambda: self.custom.list_namespaced_custom_object(
                KUEUE_GROUP,
                KUEUE_VERSION,
                meta.namespace,
                "workloads",
                label_selector=selector,
                _request_timeout=REQUEST_TIMEOUT_S,
            ),
            missing=GONE,  # Kueue is not installed
        )
        if found == GONE:
            return ""
        if isinstance(found, str):
            return f"error: {found}"
        items = found.get("items") or []
        return str(items[0]["metadata"]["name"]) if items else ""

    def drain(self, node: str, reason: str) -> Step:
        commands: list[str] = []
        cordoned = self._call(
            f"cordon node {node}",
            commands,
            lambda: self.core.patch_node(
                node,
                {"spec": {"unschedulable": True}},
                _content_type=MERGE_PATCH,
                _request_timeout=REQUEST_TIMEOUT_S,
            ),
        )
        if isinstance(cordoned, str):
            return Step([], commands, done=False, error=cordoned)
        return Step([{"node": node, "outcome": "cordoned"}], commands, done=True)

    def _call(
        self, what: str, commands: list[str], call: Callable[[], Any], missing: str = ""
    ) -> Any:
        """The call's answer, noted in `commands`. A failure comes back as a string: `missing`
        for a 404 when given, else why it failed (a 429 is a PodDisruptionBudget's refusal)."""
        try:
            answer = call()
        except self._failures as exc:
            status = getattr(exc, "status", None) if isinstance(exc, self._api_error) else None
            if status == 404 and missing:
                commands.append(f"{what}: not found")
                return missing
            if status == 429:
                why = "refused for now by a PodDisruptionBudget (HTTP 429)"
            elif status is not None:
                detail = shorten(str(getattr(exc, "body", "") or getattr(exc, "reason", "")))
                why = f"HTTP {status}: {detail}"
            else:
                why = f"no answer: {shorten(str(exc))}"
            commands.append(f"{what}: {why}")
            return why
        commands.append(f"{what}: ok")
        return answer
