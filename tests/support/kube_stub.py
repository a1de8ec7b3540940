"""A loopback stub of the few Kubernetes API endpoints the Kubernetes enforcer uses, for the
official client to talk to (through a kubeconfig that points at it). It keeps pods, Kueue
Workloads and nodes in memory, answers as the API server does, and records every request.

    GET   /api/v1/pods?fieldSelector=spec.nodeName=NODE
    GET   /apis/kueue.x-k8s.io/v1beta1/namespaces/NS/workloads?labelSelector=K in (a,b)
    PATCH /apis/kueue.x-k8s.io/v1beta1/namespaces/NS/workloads/NAME     (merge patch)
    POST  /api/v1/namespaces/NS/pods/NAME/eviction    201, or 429 while a PDB refuses
    PATCH /api/v1/nodes/NODE                                             (merge patch)
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

_IN = re.compile(r"^\s*([\w./-]+)\s+in\s+\(([^)]*)\)\s*$")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any


@dataclass
class Cluster:
    """What the stub serves. `refusals`: pod name -> evictions a PodDisruptionBudget still
    refuses (429) before it allows one; `kueue`: False answers 404, as without Kueue."""

    pods: list[dict[str, Any]] = field(default_factory=list)
    workloads: list[dict[str, Any]] = field(default_factory=list)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)
    kueue: bool = True
    requests: list[Request] = field(default_factory=list)

    def calls(self, method: str = "") -> list[tuple[str, str]]:
        """(method, path) of each request (of one method), in order."""
        return [(r.method, r.path) for r in self.requests if not method or r.method == method]


def a_pod(
    name: str,
    uid: str,
    node: str,
    *,
    namespace: str = "ml",
    owner_uid: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A running pod on `node`, owned by the Job with `owner_uid` when given."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    if labels:
        meta["labels"] = labels
    if owner_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": f"{name}-job", "uid": owner_uid}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "trainer"}]},
        "status": {"phase": "Running"},
    }


def a_workload(name: str, job_uid: str, *, namespace: str = "ml") -> dict[str, Any]:
    """A Kueue Workload made for the Job (or pod) with `job_uid`."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kueue.x-k8s.io/job-uid": job_uid},
        },
        "spec": {"active": True, "queueName": "team-a"},
    }


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 300 else "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


class _Handler(BaseHTTPRequestHandler):
    cluster: Cluster
    lock: threading.Lock

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def _serve(self, method: str) -> None:
        split = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(split.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        content_type = self.headers.get("Content-Type", "")
        with self.lock:
            self.cluster.requests.append(Request(method, split.path, query, content_type, body))
            code, answer = self._answer(method, split.path.strip("/").split("/"), query, body)
        data = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _answer(
        self, method: str, parts: list[str], query: dict[str, str], body: Any
    ) -> tuple[int, dict[str, Any]]:
        match method, parts:
            case "GET", ["api", "v1", "pods"]:
                return self._pods(query)
            case "GET", ["apis", "kueue.x-k8s.io", "v1beta1", "namespaces", ns, "workloads"]:
                return self._workloads(ns, query)
            case "PATCH", ["apis", "kueue.x-k8s.io", "v1beta1", "namespaces", ns, "workloads", n]:
                return self._patch_workload(ns, n, body)
            case "POST", ["api", "v1", "namespaces", ns, "pods", name, "eviction"]:
                return self._evict(ns, name)
            case "PATCH", ["api", "v1", "nodes", name]:
                return self._patch_node(name, body)
        return 404, _status(404, "NotFound", f"the stub does not serve {method} {self.path}")

    def _pods(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        field, _, node = query.get("fieldSelector", "").partition("=")
        if field != "spec.nodeName":
            return 400, _status(400, "BadRequest", f"the stub wants spec.nodeName, not {query}")
        items = [p for p in self.cluster.pods if p["spec"]["nodeName"] == node]
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}

    def _workloads(self, ns: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if not self.cluster.kueue:
            return 404, _status(404, "NotFound", "the server could not find the resource")
        found = _IN.match(query.get("labelSelector", ""))
        if found is None:
            return 400, _status(400, "BadRequest", f"the stub wants `key in (...)`: {query}")
        key, values = found.group(1), {v.strip() for v in found.group(2).split(",")}
        items = [
            w
            for w in self.cluster.workloads
            if w["metadata"]["namespace"] == ns and w["metadata"]["labels"].get(key) in values
        ]
        kind = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "WorkloadList"}
        return 200, kind | {"metadata": {}, "items": items}

    def _patch_workload(self, ns: str, name: str, body: Any) -> tuple[int, dict[str, Any]]:
        for workload in self.cluster.workloads:
            if (workload["metadata"]["namespace"], workload["metadata"]["name"]) == (ns, name):
                _merge(workload, body)
                return 200, workload
        return 404, _status(404, "NotFound", f'workloads "{name}" not found')

    def _evict(self, ns: str, name: str) -> tuple[int, dict[str, Any]]:
        cluster = self.cluster
        pods = [
            p
            for p in cluster.pods
            if (p["metadata"]["name"], p["metadata"]["namespace"]) == (name, ns)
        ]
        if not pods:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        if cluster.refusals.get(name, 0) > 0:
            cluster.refusals[name] -= 1
            why = "Cannot evict pod as it would violate the pod's disruption budget."
            return 429, _status(429, "TooManyRequests", why)
        cluster.pods.remove(pods[0])
        return 201, _status(201, "", "")

    def _patch_node(self, name: str, body: Any) -> tuple[int, dict[str, Any]]:
        node = self.cluster.nodes.get(name)
        if node is None:
            return 404, _status(404, "NotFound", f'nodes "{name}" not found')
        _merge(node, body)
        return 200, node


def a_node(name: str) -> dict[str, Any]:
    """A schedulable node."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}}


@contextmanager
def serving(cluster: Cluster, directory: Path) -> Iterator[Path]:
    """Serve `cluster` on a free loopback port; yields a kubeconfig file that points at it."""
    handler = type("Handler", (_Handler,), {"cluster": cluster, "lock": threading.Lock()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = directory / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(  # JSON is YAML: what the client's loader reads
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "stub",
                        "cluster": {"server": f"http://127.0.0.1:{server.server_port}"},
                    }
                ],
                "users": [{"name": "gpubot", "user": {"token": "stub-token"}}],
                "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "gpubot"}}],
                "current-context": "stub",
            }
        )
    )
    try:
        yield kubeconfig
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
