"""A record older than the operator's own last write (a re-list begun before the write and
delivered after it; a watch event that comes after the write's answer) must not make the
operator write the same change again (issue 44: "nothing written twice", found by
tests/integration/test_chaos.py in the audit log: apply, 409 on the stale version, read,
apply again). Its write is refused for the stale version; the object read then is up to date,
and nothing more is written."""

from __future__ import annotations

import copy
from typing import Any

from reconcile_support import KEY, Cluster

IMAGE = "example.com/ray:changed"


def _image(rs: dict[str, Any]) -> str:
    return str(rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"])


async def test_a_stale_record_after_the_operators_own_apply_writes_nothing_again() -> None:
    c = Cluster()
    c.reconciler.cache.rayservices_complete = True
    c.body["metadata"]["resourceVersion"] = "1"
    await c.started()
    listed = copy.deepcopy(c.api.rayservices[KEY])  # what a list begun now returns, later

    c.body["spec"]["rayService"] = {"image": IMAGE}
    c.body["metadata"]["generation"] = 2
    c.watch_servegraph()
    await c.reconcile()
    written = copy.deepcopy(c.api.rayservices[KEY])
    assert _image(written) == IMAGE and c.api.calls.count("apply_rayservice") == 1

    c.api.calls.clear()
    c.reconciler.rayservice_changed(copy.deepcopy(listed))  # the older version arrives after the write
    await c.reconcile()
    assert c.api.calls.count("apply_rayservice") == 1, "only the write refused for its stale version"
    assert c.api.calls.count("get_rayservice") == 1
    assert c.api.rayservices[KEY] == written, "the RayService was written again"
    assert c.condition("Applied") == ("True", "UpToDate")

    c.api.calls.clear()
    await c.reconcile()
    assert "apply_rayservice" not in c.api.calls and "get_rayservice" not in c.api.calls, "the read was kept"


async def test_a_rayservice_changed_by_someone_else_meanwhile_is_still_repaired() -> None:
    """The other side of the same 409: the object read is not up to date (edited since the
    record), so it is written, on the version read."""
    c = Cluster()
    c.reconciler.cache.rayservices_complete = True
    c.body["metadata"]["resourceVersion"] = "1"
    await c.started()
    listed = copy.deepcopy(c.api.rayservices[KEY])
    live = c.api.rayservices[KEY]
    live["spec"]["serveConfigV2"] = "applications: []\n"
    c.api.edit(live)  # a hand edit the watch has not delivered yet
    c.reconciler.rayservice_changed(copy.deepcopy(listed) | {"spec": {"serveConfigV2": "stale"}})
    await c.reconcile()
    assert c.api.calls.count("apply_rayservice") == 2 and c.api.calls.count("get_rayservice") == 1
    assert c.api.rayservices[KEY]["spec"]["serveConfigV2"] == listed["spec"]["serveConfigV2"]
    assert c.condition("Applied") == ("True", "UpToDate")
