"""Acceptance of the test control plane itself: real KubeRay, real RBAC, live CRD schemas,
and a harness that cleans up after itself."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from servegraph_testbed import (
    ApiError,
    Binaries,
    ComponentError,
    ControlPlane,
    KubeRayOperator,
)
from servegraph_testbed.binaries import ENV_VAR
from servegraph_testbed.waiting import eventually

pytestmark = pytest.mark.integration

RAY_IMAGE = "rayproject/ray:2.60.0"
SERVE_CONFIG = """\
applications:
- name: echo
  import_path: echo:app
  route_prefix: /
  deployments:
  - name: Echo
    num_replicas: 1
"""


def rayservice(name: str, min_replicas: Any = 1) -> dict[str, Any]:
    """A minimal valid RayService: head group + one worker group, rayStartParams {}."""

    def group_template(container: str) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": container, "image": RAY_IMAGE}]}}

    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name},
        "spec": {
            "serveConfigV2": SERVE_CONFIG,
            "rayClusterConfig": {
                "rayVersion": "2.60.0",
                "headGroupSpec": {"rayStartParams": {}, "template": group_template("ray-head")},
                "workerGroupSpecs": [
                    {
                        "groupName": "workers",
                        "replicas": 1,
                        "minReplicas": min_replicas,
                        "maxReplicas": 2,
                        "rayStartParams": {},
                        "template": group_template("ray-worker"),
                    }
                ],
            },
        },
    }


def owned_by(obj: Any, kind: str, name: str) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return any(r["kind"] == kind and r["name"] == name for r in refs)


async def test_kuberay_creates_the_raycluster_and_head_service_of_a_rayservice(
    kuberay: KubeRayOperator, admin_api: Any, namespace: str
) -> None:
    core = client.CoreV1Api(admin_api)
    custom = client.CustomObjectsApi(admin_api)
    await core.create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="registry-token"), string_data={"token": "s3cret"}),
    )
    secret = await core.read_namespaced_secret("registry-token", namespace)
    assert base64.b64decode(secret.data["token"]) == b"s3cret"

    await custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayservices", rayservice("echo"))

    async def cluster_of_rayservice() -> Any:
        listed = await custom.list_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters")
        return next((c for c in listed["items"] if owned_by(c, "RayService", "echo")), None)

    cluster = await eventually(cluster_of_rayservice, within=60, what="RayCluster of echo")
    cluster_name = cluster["metadata"]["name"]
    assert cluster["spec"]["workerGroupSpecs"][0]["groupName"] == "workers"

    async def head_service() -> Any:
        services = await core.list_namespaced_service(
            namespace, label_selector=f"ray.io/cluster={cluster_name},ray.io/node-type=head"
        )
        return services.items[0] if services.items else None

    service = await eventually(head_service, within=60, what=f"head Service of {cluster_name}")
    assert any(ref.name == cluster_name for ref in service.metadata.owner_references)

    # No kubelet: KubeRay's head pod exists (ServiceAccount admission is off) but stays Pending.
    async def head_pod() -> Any:
        pods = await core.list_namespaced_pod(
            namespace, label_selector=f"ray.io/cluster={cluster_name},ray.io/node-type=head"
        )
        return pods.items[0] if pods.items else None

    pod = await eventually(head_pod, within=60, what=f"head Pod of {cluster_name}")
    assert pod.status.phase == "Pending"

    async def rayservice_points_at_cluster() -> bool:
        obj = await custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayservices", "echo")
        status = obj.get("status") or {}
        names = {
            (status.get(key) or {}).get("rayClusterName") for key in ("activeServiceStatus", "pendingServiceStatus")
        }
        return cluster_name in names

    await eventually(rayservice_points_at_cluster, within=60, what="RayService status")
    assert kuberay.pid is not None


async def test_rbac_denies_a_restricted_identity_what_its_role_does_not_grant(
    control_plane: ControlPlane, admin_api: Any, api_client_for: Any, namespace: str
) -> None:
    user = client.CoreV1Api(await api_client_for("restricted-user"))
    with pytest.raises(ApiException) as denied:
        await user.list_namespaced_config_map(namespace)
    assert denied.value.status == 403

    rbac = client.RbacAuthorizationV1Api(admin_api)
    await rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="configmap-editor"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["get", "list", "create"])],
        ),
    )
    await rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="configmap-editor"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="configmap-editor"),
            subjects=[
                client.RbacV1Subject(
                    api_group="rbac.authorization.k8s.io",
                    kind="User",
                    name=control_plane.identity("restricted-user").user,
                )
            ],
        ),
    )

    await eventually(lambda: user.list_namespaced_config_map(namespace), within=30, what="list allowed")
    await user.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="allowed"), data={})
    )

    forbidden = [
        user.list_namespaced_secret(namespace),  # another resource
        user.delete_namespaced_config_map("allowed", namespace),  # another verb
        user.list_namespaced_config_map("default"),  # another namespace
    ]
    for call in forbidden:
        with pytest.raises(ApiException) as e:
            await call
        assert e.value.status == 403, e.value.body


async def test_service_account_token_authenticates_as_that_service_account(
    control_plane: ControlPlane, api_client_for: Any, namespace: str
) -> None:
    """The TokenRequest path: a real bound token, so ServiceAccount subjects in RBAC apply."""
    token = control_plane.service_account_token(namespace, "runner")
    api = client.AuthenticationV1Api(await api_client_for(token=token))
    review = await api.create_self_subject_review(client.V1SelfSubjectReview())
    assert review.status.user_info.username == f"system:serviceaccount:{namespace}:runner"
    assert f"system:serviceaccounts:{namespace}" in review.status.user_info.groups


async def test_api_server_rejects_a_rayservice_violating_the_crd_schema(admin_api: Any, namespace: str) -> None:
    custom = client.CustomObjectsApi(admin_api)
    with pytest.raises(ApiException) as rejected:
        await custom.create_namespaced_custom_object(
            "ray.io", "v1", namespace, "rayservices", rayservice("bad", min_replicas="1")
        )
    assert rejected.value.status == 422
    assert "workerGroupSpecs[0].minReplicas" in str(rejected.value.body)
    with pytest.raises(ApiException) as missing:
        await custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayservices", "bad")
    assert missing.value.status == 404

    # The same object with an integer is accepted: the schema, not the request, was at fault.
    await custom.create_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayservices", rayservice("good", min_replicas=1)
    )


# ---- harness hygiene: separate control planes, so the session's is not disturbed --------


def _testenv_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("servegraph-testenv-*"))


def _group_members(pgid: int) -> list[int]:
    """Pids still in process group `pgid` (read from /proc; nothing is signalled)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # after "pid (comm)": state, ppid, pgrp
            members.append(int(stat.parent.name))
    return members


def _port_is_free(port: int) -> bool:
    """Nobody listens on it (SO_REUSEADDR: a closed connection in TIME_WAIT does not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_restart_keeps_port_and_data_and_stop_leaves_nothing_behind(
    testenv_binaries: Binaries,
) -> None:
    cp = ControlPlane(testenv_binaries, audit=True).start()
    try:
        workdir, ports, pids = cp.workdir, (cp.etcd_port, cp.apiserver_port), cp.pids
        assert set(pids) == {"etcd", "kube-apiserver"}
        assert all(_group_members(pid) for pid in pids.values())
        rest = cp.rest()
        rest.apply(
            "/api/v1/namespaces/kept",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kept"}},
        )

        cp.restart_apiserver()
        assert cp.apiserver_port == ports[1]
        assert cp.pids["kube-apiserver"] != pids["kube-apiserver"]
        assert cp.pids["etcd"] == pids["etcd"]
        assert rest.get("/api/v1/namespaces/kept")["metadata"]["name"] == "kept"

        # The audit log records who was refused what (it survives the restart too).
        mark = cp.audit_log.offset()
        with pytest.raises(ApiError) as denied:
            cp.rest("restricted-user").get("/api/v1/namespaces")
        assert denied.value.status == 403
        events = cp.audit_log.events(user="restricted-user", since=mark)
        assert [(e["verb"], e["responseStatus"]["code"]) for e in events] == [("list", 403)]
        assert cp.audit_log.events(user="restricted-user", verbs={"create"}, since=mark) == []

        _faults_keep_port_and_data(cp, rest)
        pids = {**pids, **cp.pids}
    finally:
        cp.stop()

    pids_after = [*pids.values(), *cp.pids.values()]
    assert not any(_group_members(pid) for pid in pids_after)
    assert not workdir.exists()
    assert all(_port_is_free(port) for port in ports)


def _faults_keep_port_and_data(cp: ControlPlane, rest: Any) -> None:
    """What the chaos tests do to the control plane (tests/integration/test_chaos.py), each
    keeping its ports and data: the API server SIGKILLed, etcd stopped and started again (the
    API server answering nothing meanwhile), etcd compacted (a watch from before it: 410 Gone)."""
    before = cp.pids["kube-apiserver"]
    cp.restart_apiserver(kill=True)
    assert cp.pids["kube-apiserver"] != before and rest.get("/api/v1/namespaces/kept")

    etcd_pid = cp.pids["etcd"]
    cp.stop_etcd()
    assert not _group_members(etcd_pid)
    with pytest.raises(OSError):  # a timeout: the API server holds the request, etcd being gone
        rest.request("GET", "/api/v1/namespaces/kept", timeout=3)
    cp.start_etcd()
    assert rest.get("/api/v1/namespaces/kept")["metadata"]["name"] == "kept"

    old = rest.get("/api/v1/namespaces")["metadata"]["resourceVersion"]
    rest.apply("/api/v1/namespaces/later", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "later"}})
    assert cp.compact_etcd() > int(old)
    cp.restart_apiserver()  # its watch cache starts again from the compacted revision
    watch = cp.kubectl("get", "--raw", f"/api/v1/namespaces?watch=1&resourceVersion={old}&timeoutSeconds=1")
    assert '"code":410' in watch.stdout and '"reason":"Expired"' in watch.stdout, watch.stdout[:300]


def test_apiserver_failing_to_start_raises_with_its_log_tail(
    testenv_binaries: Binaries,
) -> None:
    before = _testenv_dirs()
    with pytest.raises(ComponentError) as failed:
        ControlPlane(testenv_binaries, apiserver_args=["--no-such-flag=1"]).start()
    assert failed.value.component == "kube-apiserver"
    assert "unknown flag: --no-such-flag" in str(failed.value)
    assert _testenv_dirs() == before  # etcd stopped, temp dir removed


def test_etcd_on_an_occupied_port_raises_with_its_log_tail(testenv_binaries: Binaries) -> None:
    before = _testenv_dirs()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(ComponentError) as failed:
            ControlPlane(testenv_binaries, etcd_port=port, ready_timeout=20).start()
    assert failed.value.component == "etcd"
    assert "address already in use" in failed.value.log_tail
    assert _testenv_dirs() == before


def test_kuberay_failing_to_start_raises_with_its_log_tail(control_plane: ControlPlane) -> None:
    operator = KubeRayOperator(control_plane, name="kuberay-broken", extra_args=["--batch-scheduler=no-such-scheduler"])
    with pytest.raises(ComponentError) as failed:
        operator.start()
    assert failed.value.component == "kuberay-broken"
    assert "no-such-scheduler" in failed.value.log_tail
    assert operator.pid is None
    assert "kuberay-broken" not in control_plane.pids


CHILD_TEST = """\
import asyncio, json, os
from pathlib import Path

import pytest

from servegraph_testbed import ControlPlane


@pytest.fixture(scope="session")
async def plane():
    # Like the node tier's Stack.start: a client call in a thread, stop() on any error.
    cp = ControlPlane().start()
    try:
        held = {"pids": cp.pids, "workdir": str(cp.workdir), "ports": [cp.etcd_port, cp.apiserver_port]}
        state = Path(os.environ["CHILD_STATE"])
        state.with_suffix(".tmp").write_text(json.dumps(held))
        state.with_suffix(".tmp").rename(state)  # whole, once the parent sees it
        # Stands for a `kubectl rollout status` on the node tier, which keeps retrying once
        # the API server's address is gone (a refused loopback port ends kubectl at once).
        await asyncio.to_thread(cp.run, ["sleep", "600"])
    except BaseException:
        cp.stop()
        raise
    yield cp
    cp.stop()


def test_interrupted_before_it_runs(plane):
    raise AssertionError("the parent terminates this run while the fixture is being set up")
"""

CHILD_OPTIONS = (
    "-q -p no:cacheprovider -p servegraph_testbed.pytest_plugin"
    " -o asyncio_mode=auto -o asyncio_default_fixture_loop_scope=session"
)


# The child either as a terminal starts it, or with SIGINT ignored, as a shell starts a
# background job (CI may): SIG_IGN survives exec, and Python then leaves SIGINT alone.
IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"
)
LAUNCH = {"sigint-handled": [], "sigint-ignored": [sys.executable, "-c", IGNORING_SIGINT]}


@pytest.mark.parametrize("launch", LAUNCH)
def test_a_terminated_test_run_stops_its_control_plane(tmp_path: Path, testenv_binaries: Binaries, launch: str) -> None:
    """SIGTERM (CI's timeout, `kill`) to a pytest run starting a control plane in an async
    session fixture, as the node tier's does: etcd and the API server are stopped, their
    directory removed, their ports freed, the client command the setup was waiting on
    ended — as after Ctrl-C. Without the plugin, pytest dies on the spot and all keep
    running; if stop() left the command, pytest would wait for it (600 s) before exiting."""
    (tmp_path / "test_child.py").write_text(CHILD_TEST)
    state = tmp_path / "state.json"
    child = subprocess.Popen(
        [*LAUNCH[launch], sys.executable, "-m", "pytest", *CHILD_OPTIONS.split(), "test_child.py"],
        cwd=tmp_path,
        env={**os.environ, "CHILD_STATE": str(state), ENV_VAR: str(testenv_binaries.root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pids: dict[str, int] = {}
    workdir = None
    try:
        deadline = time.monotonic() + 90
        while not state.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert state.exists(), f"the child never started its control plane: {child.communicate(timeout=30)[0]!r}"
        held = json.loads(state.read_text())
        pids, workdir, ports = held["pids"], Path(held["workdir"]), held["ports"]
        assert set(pids) == {"etcd", "kube-apiserver"} and all(_group_members(p) for p in pids.values())

        child.send_signal(signal.SIGTERM)
        try:
            out = child.communicate(timeout=60)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            raise AssertionError("pytest still running 60 s after SIGTERM") from None
        assert child.returncode == pytest.ExitCode.INTERRUPTED, (child.returncode, out[-2000:])
        assert not any(_group_members(p) for p in pids.values()), out[-2000:]
        assert not _group_members(child.pid), "the command the child's fixture ran is still running"
        assert not workdir.exists()
        assert all(_port_is_free(port) for port in ports)
    finally:
        for pgid in [child.pid, *pids.values()]:  # whatever a failed assertion left, by group
            if _group_members(pgid):
                os.killpg(pgid, signal.SIGKILL)
        child.wait(timeout=30)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
