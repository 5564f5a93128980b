"""The reconcile driven through its edges in memory: what it writes, reads and reports.

The same flows run against a real API server, KubeRay and registry in
tests/integration; here each rule is pinned down one at a time, in milliseconds.
"""

from __future__ import annotations

import copy

import pytest
from memory_writes import rayservice_defaults
from reconcile_support import KEY, MINI, NAME, NS, TOKEN, URL, Cluster, reconcile_through_downloads
from support import SAMPLES

from servegraph.graph import Format, decode, encode, load_graph
from servegraph.kube import KubeError
from servegraph.names import SPEC_HASH_ANNOTATION
from servegraph.operator.metrics import Metrics
from servegraph.operator.queue import WorkQueue
from servegraph.operator.reconcile import Reconciler, RetryLater
from servegraph.operator.spec import owner_reference, parse_spec
from servegraph.render import render_rayservice


async def test_first_reconcile_applies_the_rendered_rayservice_and_says_so_once() -> None:
    c = Cluster()
    c.watch_servegraph()
    await c.reconcile()

    spec = parse_spec(c.body["spec"], NS)
    expected = render_rayservice(
        load_graph(SAMPLES / "mini.pb"), spec.rayservice_options(NAME, NS, owner_reference(c.body))
    )
    stored = copy.deepcopy(c.api.rayservices[KEY])
    assert stored["metadata"].pop("generation") == 1
    managers = stored["metadata"].pop("managedFields")
    assert [(m["manager"], m["operation"]) for m in managers] == [("servegraph-operator", "Apply")]
    assert stored["metadata"].pop("resourceVersion")  # given by the API server, never sent on a create
    assert stored["metadata"].pop("uid") and stored["metadata"].pop("creationTimestamp")
    rayservice_defaults(expected)  # what KubeRay's schema fills in (numOfHosts, priority, port protocols)
    assert stored == expected
    # The graph is kept for a later rollback before the RayService is applied; nothing was kept
    # before, so the ConfigMap is created without a read.
    assert c.api.writes() == ["create_configmap", "apply_rayservice", "patch_servegraph_status", "post_event"]
    assert "get_configmap" not in c.api.calls
    assert c.api.calls.count("read_secret_data") == 1  # read when the download needs it, not watched
    assert [r.token for r in c.registry.requests] == [TOKEN + "\n"]
    status = c.body["status"]
    assert [(x["type"], x["status"], x["reason"]) for x in status["conditions"]] == [
        ("Fetched", "True", "Downloaded"),
        ("GraphValid", "True", "Valid"),
        ("Applied", "True", "UpToDate"),
        ("Ready", "False", "WaitingForApplications"),
        ("Progressing", "True", "RollingOut"),
    ]
    assert status["graph"]["name"] == "mini" and status["rayServiceName"] == "mini"
    assert status["rollout"]["phase"] == "Progressing" and status["rollout"]["upgrade"] == "Create"
    ((entry,),) = [status["history"]]
    assert (entry["version"], entry["outcome"], entry["rollbackAvailable"]) == ("1", "Progressing", True)
    assert status["source"]["etag"].startswith('"')
    ((type_, reason, message),) = c.api.events
    assert (type_, reason) == ("Normal", "Applied")
    assert message.startswith("created RayService mini: graph mini version '1' sha256 ")


async def test_a_steady_cluster_costs_no_reads_and_no_writes() -> None:
    c = Cluster()
    await c.started()
    for _ in range(3):  # e.g. KubeRay updating the RayService's status, a resync
        c.watch_rayservice()
        c.watch_servegraph()
        delay = await c.reconcile()  # no poll interval: only the rollout's deadline (10m) is scheduled
        assert delay is not None and delay > 590
    assert c.api.calls == []
    assert len(c.registry.requests) == 1


async def test_every_application_running_makes_ready_true() -> None:
    c = Cluster()
    await c.started()
    c.api.rayservices[KEY]["status"] = {
        "activeServiceStatus": {
            "applicationStatuses": {
                "sentiment": {
                    "status": "RUNNING",
                    "serveDeploymentStatuses": {"tokenizer": {"status": "HEALTHY"}, "sentiment": {"status": "HEALTHY"}},
                }
            }
        }
    }
    c.api.rayservices[KEY]["metadata"]["resourceVersion"] = c.api.next_version()  # KubeRay's status write
    c.watch_rayservice()
    await c.reconcile()
    assert c.condition("Ready") == ("True", "AllApplicationsRunning")
    assert c.body["status"]["applications"]["sentiment"]["deployments"]["tokenizer"] == {"status": "HEALTHY"}
    assert c.api.writes() == ["patch_servegraph_status"]  # status only: the RayService is as rendered
    assert c.api.events == []


async def test_a_first_cluster_that_cannot_schedule_its_replicas_is_named_in_ready_and_progressing() -> None:
    c = Cluster()
    await c.started()
    unscheduled = (
        "Deployment 'tokenizer' in application 'sentiment' has 1 replicas that have taken more than 30s to be "
        'scheduled. Resources required for each replica: {"CPU": 0.1}, total resources available: {}.'
    )
    rs = c.api.rayservices[KEY]
    rs["status"] = {  # KubeRay reports the first cluster's applications only as pending
        "observedGeneration": rs["metadata"]["generation"],
        "pendingServiceStatus": {
            "rayClusterName": "mini-x7k2p",
            "applicationStatuses": {
                "sentiment": {
                    "status": "DEPLOYING",
                    "serveDeploymentStatuses": {
                        "sentiment": {"status": "UPDATING"},
                        "tokenizer": {"status": "UPDATING", "message": unscheduled},
                    },
                }
            },
        },
    }
    rs["metadata"]["resourceVersion"] = c.api.next_version()
    c.watch_rayservice()
    await c.reconcile()
    why = f'application "sentiment": deployment "tokenizer": {unscheduled}'
    conditions = {x["type"]: x for x in c.body["status"]["conditions"]}
    assert conditions["Ready"]["reason"] == "ApplicationsNotRunning"
    assert conditions["Ready"]["message"] == f"KubeRay is starting Ray cluster mini-x7k2p: {why}; sentiment: DEPLOYING"
    assert conditions["Progressing"]["reason"] == "RollingOut"
    assert conditions["Progressing"]["message"].endswith(f"; {why}")
    pending = c.body["status"]["pending"]
    assert pending["rayClusterName"] == "mini-x7k2p"
    assert pending["applications"]["sentiment"]["deployments"]["tokenizer"]["message"] == unscheduled
    assert c.api.writes() == ["patch_servegraph_status"]


async def test_an_invalid_graph_keeps_the_running_rayservice() -> None:
    c = Cluster()
    await c.started()
    before = copy.deepcopy(c.api.rayservices[KEY])
    c.publish(b"not a protobuf graph")
    await c.reconcile()
    assert c.api.rayservices[KEY] == before
    assert c.condition("GraphValid") == ("False", "InvalidGraph")
    assert c.condition("Applied") == ("True", "UpToDate")
    assert c.body["status"]["graph"]["name"] == "mini"  # still the graph that runs
    assert [(t, r) for t, r, _ in c.api.events] == [("Warning", "InvalidGraph")]


async def test_a_graph_whose_workers_cannot_be_planned_is_invalid_before_anything_is_rendered() -> None:
    """What `servegraph validate` refuses the operator refuses the same way: at download, as InvalidGraph."""
    text = (SAMPLES / "mini.txtpb").read_text() + 'cluster { worker_groups { name: "tiny" cpus_per_worker: 0.1 } }\n'
    c = Cluster()
    c.registry.graphs[URL] = encode(decode(text.encode(), Format.TEXT))
    c.watch_servegraph()
    await c.reconcile()
    assert c.api.rayservices == {}
    assert c.condition("GraphValid") == ("False", "InvalidGraph")
    assert c.condition("Applied") == ("False", "NoValidGraph")
    message = next(x["message"] for x in c.body["status"]["conditions"] if x["type"] == "GraphValid")
    assert 'node "tokenizer", field resources: one replica does not fit a worker of group "tiny"' in message


async def test_a_failed_download_retries_and_warns_once() -> None:
    c = Cluster()
    c.api.add_secret(NS, "registry-token", token="wrong")
    c.watch_servegraph()
    with pytest.raises(RetryLater):
        await c.reconcile()
    assert c.condition("Fetched") == ("False", "Unauthorized")
    assert c.condition("Ready") == ("False", "NoValidGraph")
    # Applied turns False too (NoValidGraph), and every condition turning False warns.
    assert [(t, r) for t, r, _ in c.api.events] == [("Warning", "FetchFailed"), ("Warning", "ApplyFailed")]
    c.watch_servegraph()
    await c.reconcile()  # before the retry is due: no download, nothing new to say
    assert len(c.registry.requests) == 1
    assert len(c.api.events) == 2


async def test_a_rotated_token_is_read_again_when_the_registry_refuses_the_old_one() -> None:
    """Secrets are read on demand and kept 10 s: a rotation that revokes the old token costs
    one refused request, in the same download, not a wait for the copy to expire."""
    c = Cluster()
    await c.started()
    c.registry.token = "rotated"
    c.api.add_secret(NS, "registry-token", token="rotated")
    c.publish(MINI)  # e.g. a refresh, within 10 s of the last read
    await c.reconcile()
    assert [r.token for r in c.registry.requests[-2:]] == [TOKEN + "\n", "rotated"]
    assert c.api.calls.count("read_secret_data") == 1  # once more, after the 401
    assert c.condition("Fetched") == ("True", "NotModified")


async def test_a_token_read_within_its_cache_time_is_not_read_again() -> None:
    c = Cluster()
    await c.started()
    c.publish(MINI)
    await c.reconcile()
    assert "read_secret_data" not in c.api.calls and len(c.registry.requests) == 2
    c.reconciler.secrets.ttl_s = 0.0  # as if 10 s had passed
    c.publish(MINI)
    await c.reconcile()
    assert c.api.calls.count("read_secret_data") == 1


async def test_an_edited_rayservice_is_put_back() -> None:
    c = Cluster()
    await c.started()
    c.api.rayservices[KEY]["spec"]["serveConfigV2"] = "applications: []\n"
    c.api.edit(c.api.rayservices[KEY])
    c.watch_rayservice()
    await c.reconcile()
    assert c.api.writes() == ["apply_rayservice", "post_event"]
    assert c.api.rayservices[KEY]["spec"]["serveConfigV2"].startswith("proxy_location:")
    assert c.api.events == [("Normal", "Applied", "updated RayService mini")]


async def test_a_deleted_rayservice_is_created_again() -> None:
    c = Cluster()
    await c.started()
    c.watch_rayservice(deleted=True)
    await c.reconcile()
    assert KEY in c.api.rayservices
    assert c.api.events == [("Normal", "Applied", "created RayService mini")]


async def test_after_a_restart_an_unseen_rayservice_is_read_once_and_not_written_when_it_matches() -> None:
    """A new operator process whose RayService watch has not delivered yet: one GET, no apply."""
    c = Cluster()
    await c.started()
    fresh = Reconciler(c.api, c.registry, Metrics(), WorkQueue())
    fresh.servegraph_changed(copy.deepcopy(c.body))
    await reconcile_through_downloads(fresh, KEY)
    assert c.api.calls.count("get_rayservice") == 1
    assert "apply_rayservice" not in c.api.calls and "patch_servegraph_status" not in c.api.calls


async def test_a_failed_apply_is_reported_and_retried() -> None:
    c = Cluster()
    c.api.failures["apply_rayservice"] = KubeError(
        "Invalid", "apply RayService team-a/mini: spec.x: Invalid value", 422
    )
    c.watch_servegraph()
    with pytest.raises(RetryLater):
        await c.reconcile()
    assert c.condition("Applied") == ("False", "ApplyFailed")
    assert [(t, r) for t, r, _ in c.api.events] == [("Normal", "Fetched"), ("Warning", "ApplyFailed")]
    del c.api.failures["apply_rayservice"]
    c.watch_servegraph()
    await c.reconcile()
    assert c.condition("Applied") == ("True", "UpToDate")
    assert c.api.rayservices[KEY]["metadata"]["annotations"][SPEC_HASH_ANNOTATION]


async def test_a_missing_token_secret_is_a_fetch_condition_naming_it() -> None:
    c = Cluster()
    del c.api.secrets[(NS, "registry-token")]
    c.watch_servegraph()
    with pytest.raises(RetryLater):
        await c.reconcile()
    assert c.condition("Fetched") == ("False", "SecretNotFound")
    assert c.registry.requests == []


async def test_a_missing_key_never_shows_the_secret_value() -> None:
    c = Cluster(tokenSecretRef={"name": "registry-token", "key": "bearer"})
    c.watch_servegraph()
    with pytest.raises(RetryLater):
        await c.reconcile()
    fetched = next(x for x in c.body["status"]["conditions"] if x["type"] == "Fetched")
    assert (fetched["reason"], fetched["message"]) == (
        "SecretKeyNotFound",
        "Secret team-a/registry-token has no key 'bearer'",
    )
    assert TOKEN not in str(c.body["status"]) and TOKEN not in str(c.api.events)


async def test_an_invalid_spec_is_reported_without_downloading() -> None:
    c = Cluster()
    c.body["spec"]["source"]["pollInterval"] = "5 minutes"
    c.watch_servegraph()
    await c.reconcile()
    assert c.condition("Fetched") == ("False", "InvalidSpec")
    assert c.registry.requests == [] and c.api.rayservices == {}


async def test_a_servegraph_deleted_during_its_reconcile_is_not_an_error() -> None:
    c = Cluster()
    c.watch_servegraph()
    del c.api.servegraphs[KEY]
    await c.reconcile()  # the status patch answers 404: nothing more to do
    assert c.api.events == []


async def test_a_poll_interval_schedules_the_next_reconcile() -> None:
    c = Cluster(pollInterval="5m")
    c.watch_servegraph()
    delay = await c.reconcile()
    assert delay is not None and 299 < delay <= 300


async def test_a_ca_bundle_from_a_configmap_reaches_the_download() -> None:
    c = Cluster(caBundle={"configMapRef": {"name": "registry-ca"}})
    c.api.configmaps[(NS, "registry-ca")] = {"ca.crt": "-----BEGIN CERTIFICATE-----\n..."}
    c.watch_servegraph()
    await c.reconcile()
    assert c.registry.requests[0].ca_pem == "-----BEGIN CERTIFICATE-----\n..."


async def test_the_status_written_replaces_the_cached_body_and_edits_no_copy_held() -> None:
    """A reconcile may hold the cached body while another one writes: the status write puts a
    new body in the cache (the watch delivers the object later) and leaves the old one as it was."""
    c = Cluster()
    c.watch_servegraph()
    held = c.reconciler.cache.body(KEY)
    assert held is not None and "status" not in held
    await c.reconcile()
    assert "status" not in held  # not edited in place
    cached = c.reconciler.cache.body(KEY)
    assert cached is not held
    assert cached is not None and cached["status"] == c.body["status"]  # what the API server now has
