"""What a hostile or careless tenant tries inside the cluster (issue 14, items 4, 7, 8, 9, 10),
against `servegraph run` as a real process bound by the shipped ClusterRole, with the API
server's audit log as the witness of what the operator read and wrote."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException
from security_support import (
    EVENTS_TOKEN,
    MAX_FETCH_SECONDS,
    REGISTRY_TOKEN,
    SYSTEM_NS,
    Secured,
    operator_writes,
    secured_kit,
    start_secured,
)
from sg_support import OPERATOR_USER, Kit, delete_namespace, sample_bytes, start_operator
from stall_proxy import StallProxy
from support import ROOT

from servegraph.kube import KubeClient, KubeError, connect
from servegraph.operator.run.events_endpoint import FailedAuth
from servegraph_testbed import ControlPlane
from servegraph_testbed.registry import Fault, RegistryServer
from servegraph_testbed.waiting import eventually

GROUP, VERSION, PLURAL = "servegraph.io", "v1alpha1", "servegraphs"


@pytest.fixture(scope="module")
def secured(control_plane: ControlPlane) -> Iterator[Secured]:
    yield from start_secured(control_plane, "servegraph-operator-cluster")


@pytest.fixture
async def kit(
    secured: Secured, admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str
) -> AsyncIterator[Kit]:
    async with secured_kit(admin_api, namespace, registry, ca_pem) as k:
        yield k


async def _deploy(kit: Kit, sg: str, **spec: Any) -> None:
    """A ServeGraph with its own graph, created with `spec` (rayService, ...) from the start."""
    graph = f"{kit.namespace}-{sg}"
    kit.registry.registry.publish(graph, sample_bytes("mini"))
    source = {
        "url": kit.registry.url(graph),
        "tokenSecretRef": {"name": "registry-token"},
        "caBundle": {"secretRef": {"name": "registry-ca"}},
    }
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ServeGraph",
        "metadata": {"name": sg},
        "spec": {"source": source, **spec},
    }
    await kit.custom.create_namespaced_custom_object(GROUP, VERSION, kit.namespace, PLURAL, body)


def _hand_made(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "serveConfigV2": "applications: []\n",
            "rayClusterConfig": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{"name": "ray-head", "image": "example.com/ray:mine"}]}},
                }
            },
        },
    }


# -- 4 ------------------------------------------------------------------------------------


async def _reconciled(secured: Secured, namespace: str, name: str, times: int) -> None:
    """Until the operator has ended `times` reconciles of the ServeGraph, each a chance to
    write: what "nothing happened" is counted in, rather than in seconds slept."""

    async def enough() -> float:
        n = await secured.metric("servegraph_graph_reconcile_duration_seconds_count", namespace=namespace, name=name)
        assert n >= times, f"{n:.0f} reconciles so far"
        return n

    await eventually(enough, within=60, what=f"{times} reconciles of ServeGraph {namespace}/{name}")


async def test_a_rayservice_made_by_hand_is_not_taken_over(
    kit: Kit, control_plane: ControlPlane, secured: Secured
) -> None:
    made = await kit.custom.create_namespaced_custom_object(
        "ray.io", "v1", kit.namespace, "rayservices", _hand_made(kit.namespace, "g"), field_manager="a-person"
    )
    mark = control_plane.audit_log.offset()
    await _deploy(kit, "g")
    ready = await kit.wait_condition("g", "Ready", "False", "Conflict")
    # Named by who wrote it; KubeRay may have written it too by then (its metadata, not only its status).
    assert f"RayService {kit.namespace}/g exists and no ServeGraph controls it (written by " in ready["message"]
    assert "a-person" in ready["message"]
    assert (await kit.condition("g", "Applied") or {})["reason"] == "Conflict"
    # The pass that found the conflict, the one its status write triggers, and a retry on the backoff timer.
    await _reconciled(secured, kit.namespace, "g", times=3)
    assert operator_writes(control_plane, kit.namespace, mark, "rayservices") == []
    now = await kit.get_rs("g")
    # The person's spec as they wrote it (KubeRay adds empty defaults: `metadata: {}`, `resources: {}`).
    assert now is not None and not now["metadata"].get("ownerReferences")
    assert now["spec"]["serveConfigV2"] == made["spec"]["serveConfigV2"]
    (head,) = now["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert (head["name"], head["image"]) == ("ray-head", "example.com/ray:mine")


async def test_two_servegraphs_naming_one_rayservice_never_flip_it(
    kit: Kit, control_plane: ControlPlane, secured: Secured
) -> None:
    mark = control_plane.audit_log.offset()
    await _deploy(kit, "a", rayService={"name": "shared"})
    await kit.wait_condition("a", "Applied", "True")
    await _deploy(kit, "b", rayService={"name": "shared"})
    ready = await kit.wait_condition("b", "Ready", "False", "Conflict")
    assert f"ServeGraph {kit.namespace}/a" in ready["message"]
    await _reconciled(secured, kit.namespace, "b", times=3)  # b retries with backoff meanwhile
    applies = operator_writes(control_plane, kit.namespace, mark, "rayservices")
    assert [(e["verb"], e["objectRef"]["name"]) for e in applies] == [("patch", "shared")], "it flipped"
    rs = await kit.get_rs("shared")
    assert rs is not None and rs["metadata"]["ownerReferences"][0]["name"] == "a"


# -- 7 ------------------------------------------------------------------------------------


async def test_a_servegraph_deleted_while_downloading_gets_no_rayservice(
    kit: Kit, control_plane: ControlPlane, secured: Secured
) -> None:
    graph = f"{kit.namespace}-slow"
    kit.registry.registry.publish(graph, sample_bytes("mini"))
    kit.registry.registry.faults[graph] = Fault(hang_s=2.5)
    mark = control_plane.audit_log.offset()
    await kit.servegraph("slow", graph)
    await eventually(
        lambda: _ready(bool(kit.requests_for(graph))),
        within=30,
        what="the download to start",
    )
    # Its download is in flight (beside the reconcile workers: operator/fetch/downloads.py).
    await kit.custom.delete_namespaced_custom_object(GROUP, VERSION, kit.namespace, PLURAL, "slow")

    async def download_dropped() -> bool:
        return await secured.metric("servegraph_downloads", state="running") == 0

    await eventually(download_dropped, within=30, what="the deleted ServeGraph's download to be dropped")
    assert kit.requests_for(graph), "the download never started"
    assert await kit.get_rs("slow") is None
    writes = operator_writes(control_plane, kit.namespace, mark)
    assert writes == [], [(e["verb"], e["objectRef"]) for e in writes]


# -- 8 ------------------------------------------------------------------------------------


async def test_the_operator_reads_only_the_secrets_servegraphs_name(kit: Kit, control_plane: ControlPlane) -> None:
    def can(*args: str) -> bool:
        out = control_plane.kubectl("auth", "can-i", *args, identity=OPERATOR_USER, check=False)
        return out.stdout.strip() == "yes"

    assert can("get", "secrets", "-n", kit.namespace)
    assert not can("list", "secrets", "-A") and not can("watch", "secrets", "-A")
    await kit.secret("unrelated", {"password": "n0t-the-operat0rs"})
    mark = control_plane.audit_log.offset()
    await _deploy(kit, "g")
    await kit.wait_condition("g", "Applied", "True")
    reads = control_plane.audit_log.events(user=OPERATOR_USER, resource="secrets", since=0)
    assert {e["verb"] for e in reads} == {"get"}, "the operator listed or watched Secrets"
    here = control_plane.audit_log.events(user=OPERATOR_USER, resource="secrets", namespace=kit.namespace, since=mark)
    assert {e["objectRef"]["name"] for e in here} == {"registry-token", "registry-ca"}


# -- 9 ------------------------------------------------------------------------------------


async def test_a_failed_url_change_does_not_look_current(kit: Kit) -> None:
    await _deploy(kit, "g")
    await kit.wait_condition("g", "Applied", "True")
    await kit.patch_sg("g", {"spec": {"source": {"url": kit.registry.url(f"{kit.namespace}-missing")}}})
    await kit.wait_condition("g", "Fetched", "False", "NotFound")
    sg = await kit.get_sg("g")
    generations = {c["type"]: c["observedGeneration"] for c in sg["status"]["conditions"]}
    assert sg["metadata"]["generation"] == 2
    assert generations["Fetched"] == 2
    assert generations["GraphValid"] == 1, "the old URL's valid graph reads as the new URL's"


# -- 10 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["https://", "https:///v1/graphs/x", "https://:443/v1/graphs/x"])
async def test_the_crd_refuses_a_url_without_a_host(kit: Kit, url: str) -> None:
    with pytest.raises(ApiException) as err:
        await kit.servegraph("nohost", "x", url=url)
    assert err.value.status == 422
    assert "url must be an absolute URL with a host" in err.value.body


@pytest.mark.parametrize(
    "bundle",
    [{"secretRef": {"name": ".."}}, {"configMapRef": {"name": "a/b"}}, {"secretRef": {"name": "ca", "key": "../ca"}}],
    ids=["dot-dot", "slash", "key"],
)
async def test_the_crd_refuses_a_ca_bundle_reference_that_is_no_object_name(kit: Kit, bundle: dict[str, Any]) -> None:
    """Like the token's: a name that is no object's name is refused when written, not when read."""
    with pytest.raises(ApiException) as err:
        await kit.servegraph("badca", "x", caBundle=bundle)
    assert err.value.status == 422
    assert "spec.source.caBundle." in err.value.body and "should match" in err.value.body


async def _post(port: int, token: str, subject: str) -> int:
    headers = {
        "Authorization": f"Bearer {token}",
        "ce-specversion": "1.0",
        "ce-type": "io.servegraph.graph.published",
        "ce-source": "https://registry.example.com",
        "ce-id": f"ev-{time.monotonic_ns()}",
        "ce-subject": subject,
        "Content-Type": "application/json",
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://127.0.0.1:{port}/v1/events", headers=headers, data=b"{}") as resp,
    ):
        return resp.status


async def test_the_events_endpoint_logs_no_query_and_slows_guessing(secured: Secured) -> None:
    secret = "qu3ry-t0ken-in-a-subject"
    assert (
        await _post(secured.events_port, EVENTS_TOKEN, f"https://registry.example.com/g?access_token={secret}") == 202
    )
    statuses = [await _post(secured.events_port, f"guess-{i}", "https://registry.example.com/g") for i in range(12)]
    assert 429 in statuses and statuses[:3] == [403, 403, 403], statuses
    # A blocked address is refused before its token is even looked at. Blocked means: since the
    # last 429, under 2 s (one refill at 0.5/s) have passed; on a starved machine more may have,
    # and then the address is drained again with guesses and the right token tried once more.
    for _ in range(5):
        for _ in range(10):
            if await _post(secured.events_port, "guess", "https://registry.example.com/g") == 429:
                break
        else:
            raise AssertionError("10 more wrong guesses, none refused with 429")
        blocked = time.monotonic()
        got = await _post(secured.events_port, EVENTS_TOKEN, "https://registry.example.com/g")
        if got == 429:
            break
        assert time.monotonic() - blocked >= 1 / FailedAuth().rate, f"a blocked address got {got} for the right token"
    else:
        raise AssertionError("the machine never let the right token follow a 429 within 2 s")
    # Logged before the 202 was sent; the file may lag. The only line naming the graph is the one the query was cut from.
    await eventually(lambda: _ready("registry.example.com/g" in secured.log), within=10, what="the event's log line")
    assert secret not in secured.log


async def test_events_token_rotation_is_seen_in_single_namespace_mode(
    control_plane: ControlPlane, namespace: str
) -> None:
    """Watching one namespace, with the token Secret in another that it may only `get`."""
    cp = control_plane
    role = yaml.safe_load((ROOT / "config" / "rbac" / "role.yaml").read_text())
    role.update(kind="Role", metadata={"name": "servegraph-operator-ns", "namespace": namespace})
    secret = "rotating-events"
    token_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "events-token", "namespace": SYSTEM_NS},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret], "verbs": ["get"]}],
    }
    cp.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([role, token_role]))
    cp.kubectl(
        "create", "rolebinding", "sg-ns", "-n", namespace, "--role=servegraph-operator-ns", f"--user={OPERATOR_USER}"
    )
    cp.kubectl(
        "create",
        "rolebinding",
        "sg-events",
        "-n",
        SYSTEM_NS,
        "--role=events-token",
        f"--user={OPERATOR_USER}",
        check=False,
    )

    def put(token: str) -> None:
        value = base64.b64encode(token.encode()).decode()
        cp.kubectl(
            "apply", "-f", "-",
            stdin=f"apiVersion: v1\nkind: Secret\nmetadata: {{name: {secret}, namespace: {SYSTEM_NS}}}\ndata: {{token: {value}}}\n",
        )  # fmt: skip

    put("first-t0ken")
    from servegraph_testbed.processes import free_port

    port = free_port()
    component, _ = await asyncio.to_thread(
        start_operator,
        cp,
        "servegraph-operator-ns",
        f"--namespace={namespace}",
        f"--events-address=127.0.0.1:{port}",
        f"--events-token-secret={SYSTEM_NS}/{secret}",
    )
    try:

        async def first() -> bool:
            # 503 until the operator has listed its ServeGraphs (an event before that could be lost)
            status = await _post(port, "first-t0ken", "https://registry.example.com/g")
            assert status in (202, 503), status
            return status == 202

        await eventually(first, within=30, what="the operator to list its ServeGraphs and accept the first token")
        put("second-t0ken")
        started = time.monotonic()

        async def accepted() -> bool:
            return await _post(port, "second-t0ken", "https://registry.example.com/g") == 202

        await eventually(accepted, within=30, what="the rotated events token to be accepted")
        print(f"rotated events token accepted after {time.monotonic() - started:.1f} s")
        assert await _post(port, "first-t0ken", "https://registry.example.com/g") == 403
    finally:
        cp.unspawn(component)


async def test_calls_to_the_api_server_time_out(control_plane: ControlPlane, tmp_path: Path) -> None:
    """A stalled connection to the API server costs a call its timeout, not a worker forever."""
    proxy = StallProxy("127.0.0.1", control_plane.apiserver_port).start()
    config = yaml.safe_load(control_plane.kubeconfig("admin").read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    api = await connect(str(path))
    kube = KubeClient(api, timeout_s=1.0)
    try:
        # Through the proxy, answered (with the default timeout: a starved machine may take over 1 s).
        assert await KubeClient(api).get_rayservice("default", "nothing") is None
        proxy.hold()
        started = time.monotonic()
        with pytest.raises(KubeError) as err:
            await asyncio.wait_for(kube.get_rayservice("default", "nothing"), timeout=30)
        # Its own 1 s, not the default 10 s nor forever.
        assert err.value.reason == "Timeout" and time.monotonic() - started < 6
    finally:
        proxy.release()
        await kube.api.close()
        proxy.stop()


async def _ready(value: bool) -> bool:
    return value


# -- issue 45, item 1 --------------------------------------------------------------------


async def test_slow_registries_in_other_namespaces_hold_no_victims_download_or_repair(
    kit: Kit, admin_api: Any, secured: Secured
) -> None:
    """A tenant with two namespaces of 12 ServeGraphs each, whose registries trickle their
    bytes until the download deadline, held all four reconcile workers before issue 45: a
    victim's new ServeGraph waited (K/2) x the deadline. Now downloads run beside the workers,
    two per namespace and a fair share of the rest: the victim's download starts at once and
    a repair of its RayService is queued behind no download."""
    hostile: list[Kit] = []
    core = client.CoreV1Api(admin_api)
    try:
        for t in range(2):
            ns = f"{kit.namespace}-slow{t}"
            await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
            tenant = Kit(admin_api, ns, kit.registry, kit.ca_pem)
            await tenant.secret("registry-token", {"token": REGISTRY_TOKEN})
            await tenant.secret("registry-ca", {"ca.crt": kit.ca_pem})
            hostile.append(tenant)
        await _deploy(kit, "steady")  # the victim's ServeGraph, serving before the storm
        await eventually(lambda: kit.get_rs("steady"), within=30, what="the victim's RayService")
        for tenant in hostile:
            for i in range(12):
                graph = f"{tenant.namespace}-g{i}"
                tenant.registry.registry.publish(graph, sample_bytes("mini") + b"\0" * 20_000)
                tenant.registry.registry.faults[graph] = Fault(trickle_bytes_per_s=64)
                await tenant.servegraph(f"g{i}", graph)

        async def held() -> bool:
            running = await secured.metric("servegraph_downloads", state="running")
            assert running >= 4, f"{running:.0f} slow downloads running"
            return True

        await eventually(held, within=30, what="the slow registries holding downloads")

        # The victim's new ServeGraph: its download starts while the slow ones are held.
        graph = f"{kit.namespace}-new"
        kit.registry.registry.publish(graph, sample_bytes("mini"))
        created = time.monotonic()
        await kit.servegraph("new", graph)
        await eventually(lambda: _ready(bool(kit.requests_for(graph))), within=30, interval=0.05, what="its download")
        started = time.monotonic() - created
        await eventually(lambda: kit.get_rs("new"), within=30, interval=0.1, what="its RayService")
        applied = time.monotonic() - created

        # A repair, which downloads nothing: the victim's RayService deleted by hand.
        await kit.custom.delete_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayservices", "steady")
        deleted = time.monotonic()

        async def repaired() -> bool:
            rs = await kit.get_rs("steady")
            return rs is not None and rs["metadata"].get("deletionTimestamp") is None

        await eventually(repaired, within=30, interval=0.1, what="the victim's RayService repaired")
        repair = time.monotonic() - deleted
        still = await secured.metric("servegraph_downloads", state="running")
        print(
            f"\nissue 45.1: 24 trickling registries (64 B/s, deadline {MAX_FETCH_SECONDS} s), {still:.0f} downloads "
            f"still held: the victim's download started after {started:.2f} s, its RayService applied after "
            f"{applied:.2f} s; a deleted RayService repaired after {repair:.2f} s"
        )
        assert still >= 2, "the slow downloads were over before the victim's were measured"
        assert started < 9, f"the victim's download waited {started:.1f} s behind other namespaces' slow registries"
        assert repair < 10, f"a repair waited {repair:.1f} s behind downloads"
    finally:
        kit.registry.registry.faults.clear()
        for tenant in hostile:
            await delete_namespace(admin_api, tenant.namespace)
