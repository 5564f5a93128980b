"""What the operator's integration tests share: a running operator, a real HTTPS
registry, and small async helpers over the admin API client."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException
from support import ROOT, SAMPLES

from servegraph_testbed import Component, ControlPlane
from servegraph_testbed.processes import free_port, http_probe
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.waiting import eventually

GROUP, VERSION, PLURAL = "servegraph.io", "v1alpha1", "servegraphs"
OPERATOR_USER = "servegraph-operator"


async def delete_namespace(admin_api: Any, namespace: str) -> None:
    """Delete a test's namespace, its ServeGraphs first.

    With no namespace controller the namespace stays Terminating with everything in it: a
    ServeGraph left there would be polled by every later module's operator, at a registry
    port a later test's registry may be given again."""
    await client.CustomObjectsApi(admin_api).delete_collection_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL
    )
    await client.CoreV1Api(admin_api).delete_namespace(namespace)


LOOPBACK_SOURCES = "--allowed-source-networks=127.0.0.0/8"
"""The test registry listens on loopback, which the default source policy refuses: an
administrator's exception, as a development cluster's would be."""


def start_operator(
    cp: ControlPlane, name: str = "servegraph-operator", *args: str, env: dict[str, str] | None = None
) -> tuple[Component, int]:
    """`servegraph run` as a real process, as the identity bound by config/rbac only."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "servegraph.cli",
        "run",
        "--health-address",
        f"127.0.0.1:{port}",
        LOOPBACK_SOURCES,
    ]
    argv += args
    component = cp.spawn(name, argv, identity=OPERATOR_USER, env={"PYTHONUNBUFFERED": "1", **(env or {})})
    component.wait_ready(lambda: http_probe(f"http://127.0.0.1:{port}/readyz"), timeout=60)
    return component, port


def bind_operator_rbac(cp: ControlPlane) -> None:
    """The shipped ClusterRole, bound to the operator's identity and nothing more."""
    cp.kubectl("apply", "-f", str(ROOT / "config" / "rbac" / "role.yaml"))
    binding = f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: servegraph-operator-test}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: servegraph-operator}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {OPERATOR_USER}}}]
"""
    cp.kubectl("apply", "-f", "-", stdin=binding)
    # The authorizer learns the binding from its informer a moment after it is stored: an
    # operator started in that moment reads its one-time facts (the RayService CRD) as 403.
    deadline = time.monotonic() + 30
    while not allowed(
        cp, OPERATOR_USER, "", "get", "apiextensions.k8s.io", "customresourcedefinitions", "rayservices.ray.io"
    ):
        if time.monotonic() > deadline:
            raise AssertionError(f"the ClusterRoleBinding of {OPERATOR_USER} not in effect within 30 s")
        time.sleep(0.1)


SYSTEM_NS = "servegraph-system"
"""The operator's own namespace, where its Lease and events token live."""


def bind_leader_election_rbac(cp: ControlPlane, binding: str) -> None:
    """The shipped ClusterRole and the Lease's Role (config/rbac) bound to the operator's
    identity, for a test whose operators elect a leader; `binding` names the RoleBinding."""
    bind_operator_rbac(cp)
    cp.kubectl("create", "namespace", SYSTEM_NS, check=False)
    cp.kubectl("apply", "-f", str(ROOT / "config" / "rbac" / "leader_election_role.yaml"))
    cp.kubectl(
        "create", "rolebinding", binding, "-n", SYSTEM_NS,
        "--role=servegraph-operator-leader-election", f"--user={OPERATOR_USER}", check=False,
    )  # fmt: skip


@dataclass
class Kit:
    """Admin-side helpers for one test namespace."""

    api: Any
    namespace: str
    registry: RegistryServer
    ca_pem: str

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    def requests_for(self, graph: str) -> list[dict[str, Any]]:
        """The registry's requests for one graph: the registry is the test's, its port may have
        been another's, whose ServeGraphs may still ask it for theirs."""
        return [r for r in self.registry.registry.requests if r["name"] == graph]

    async def secret(self, name: str, data: dict[str, str]) -> None:
        body = {
            "metadata": {"name": name},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }
        try:
            await self.core.create_namespaced_secret(self.namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            await self.core.replace_namespaced_secret(name, self.namespace, body)

    async def servegraph(self, name: str, graph: str, **source: Any) -> dict[str, Any]:
        """Create a ServeGraph reading `graph` from the test registry with the `token` Secret."""
        spec_source = {
            "url": self.registry.url(graph),
            "tokenSecretRef": {"name": "registry-token"},
            "caBundle": {"secretRef": {"name": "registry-ca"}},
            **source,
        }
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ServeGraph",
            "metadata": {"name": name},
            "spec": {"source": spec_source},
        }
        obj: dict[str, Any] = await self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, body
        )
        return obj

    async def patch_sg(self, name: str, patch: dict[str, Any]) -> None:
        await self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, patch, _content_type="application/merge-patch+json"
        )

    async def get_sg(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = await self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        return obj

    async def get_rs(self, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self.custom.get_namespaced_custom_object(
                "ray.io", "v1", self.namespace, "rayservices", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def condition(self, sg: str, type_: str) -> dict[str, Any] | None:
        status = (await self.get_sg(sg)).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)

    async def wait_condition(
        self,
        sg: str,
        type_: str,
        status: str,
        reason: str | None = None,
        within: float = 60,
        message: str | None = None,
    ) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            cond = await self.condition(sg, type_)
            if (
                cond
                and cond["status"] == status
                and (reason is None or cond["reason"] == reason)
                and (message is None or cond["message"] == message)
            ):
                return cond
            return None

        said = "" if message is None else f": {message}"
        return await eventually(check, within=within, what=f"{type_}={status} ({reason}){said} on ServeGraph {sg}")

    async def wait_rs(
        self, name: str, check: Callable[[dict[str, Any]], bool] = lambda _: True, within: float = 60
    ) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            rs = await self.get_rs(name)
            return rs if rs is not None and check(rs) else None

        try:
            return await eventually(probe, within=within, what=f"RayService {self.namespace}/{name}")
        except AssertionError as e:  # say what the operator reported meanwhile
            status = (await self.get_sg(name)).get("status") or {}
            raise AssertionError(f"{e}\nServeGraph status: {status}") from e


def sample_bytes(name: str) -> bytes:
    return (SAMPLES / f"{name}.pb").read_bytes()


def read_log(path: Path) -> str:
    return path.read_text(errors="replace")


TENANT = "restricted-user"
"""The identity a tenant's tests act as: it may edit ServeGraphs and Ray objects in its namespace only."""

_TENANT_ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: tenant, namespace: {namespace}}}
rules:
- apiGroups: [servegraph.io]
  resources: [servegraphs]
  verbs: [get, list, create, update, patch, delete]
- apiGroups: [ray.io]
  resources: [rayservices, rayclusters, rayjobs]
  verbs: [get, list, create, update, patch, delete]
"""


def allowed(cp: ControlPlane, user: str, namespace: str, verb: str, group: str, resource: str, name: str = "") -> bool:
    """What the API server's authorizer answers for `user` (a SubjectAccessReview)."""
    plural, _, subresource = resource.partition("/")
    attributes = {"namespace": namespace, "verb": verb, "group": group, "resource": plural}
    attributes |= {"subresource": subresource, "name": name}
    review = cp.rest().request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "resourceAttributes": attributes},
        },
    )
    return bool(review["status"].get("allowed"))


async def tenant_api(control_plane: ControlPlane, namespace: str, api_client_for: Any) -> Any:
    """An ApiClient as TENANT, bound to the tenant Role in `namespace`, once the Role is in effect.

    The authorizer learns new Roles from its informers, a moment after they are stored: a
    test starting in that moment would read "forbidden" where the policy should answer.
    """
    control_plane.kubectl("apply", "-f", "-", stdin=_TENANT_ROLE.format(namespace=namespace))
    control_plane.kubectl("create", "rolebinding", "tenant", "-n", namespace, "--role=tenant", f"--user={TENANT}")
    api = await api_client_for(TENANT)
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                namespace=namespace, verb="create", group="ray.io", resource="rayservices"
            )
        )
    )

    async def allowed() -> bool:
        answer = await client.AuthorizationV1Api(api).create_self_subject_access_review(review)
        return bool(answer.status.allowed)

    await eventually(allowed, within=30, interval=0.1, what="the tenant's Role in effect")
    return api


POLICY = "servegraph-pod-policy"
POLICY_NS = "servegraph-system"


@contextmanager
def pod_policy(cp: ControlPlane) -> Iterator[None]:
    """The pod policy (config/policy) installed as docs/security.md says, for one module, and
    removed after it; the next module installs it again, as an administrator would."""
    cp.kubectl("create", "namespace", POLICY_NS, check=False)
    cp.kubectl("apply", "-k", str(ROOT / "config" / "policy" / "crd"))
    cp.kubectl("wait", "--for=condition=Established", "crd/servegraphpodpolicies.servegraph.io", "--timeout=60s")
    cp.kubectl("apply", "-k", str(ROOT / "config" / "policy"))
    try:
        yield
    finally:
        cp.kubectl("delete", "-k", str(ROOT / "config" / "policy"), "--wait=false", check=False)


def set_pod_policy(cp: ControlPlane, **values: str) -> None:
    """Set keys of the policy's parameters (its ServeGraphPodPolicy), as an administrator."""
    patch = json.dumps({"spec": values})
    cp.kubectl("patch", "servegraphpodpolicy", POLICY, "-n", POLICY_NS, "--type=merge", "-p", patch)
