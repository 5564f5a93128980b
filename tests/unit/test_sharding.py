"""Sharding's pure parts: the flags, the watch selector, "is it mine", and the reconciler
writing nothing for a ServeGraph moved to another shard while it was being reconciled."""

from __future__ import annotations

import copy

import kopf
import pytest
from reconcile_support import KEY, Cluster, reconcile_through_downloads

from servegraph.names import GROUP, PLURAL, SHARD_LABEL, VERSION
from servegraph.operator.metrics import Metrics
from servegraph.operator.reconcile import Reconciler
from servegraph.operator.run.kopf_settings import configure
from servegraph.operator.run.sharding import Shard
from servegraph.source import Fetched, FetchRequest


def _sg(labels: dict[str, str] | None) -> dict[str, object]:
    return {"metadata": {"name": "g", "namespace": "ns", **({"labels": labels} if labels is not None else {})}}


@pytest.mark.parametrize(
    ("shard", "selector"),
    [(Shard(), ""), (Shard("a"), f"{SHARD_LABEL}=a"), (Shard(None, default=True), f"!{SHARD_LABEL}")],
)
def test_selector(shard: Shard, selector: str) -> None:
    assert shard.selector() == selector


@pytest.mark.parametrize(
    ("labels", "unsharded", "a", "default"),
    [
        (None, True, False, True),
        ({}, True, False, True),
        ({"team": "x"}, True, False, True),
        ({SHARD_LABEL: "a"}, True, True, False),
        ({SHARD_LABEL: "b"}, True, False, False),
        ({SHARD_LABEL: ""}, True, False, False),  # labelled, even if empty: not the default shard's
    ],
)
def test_owns_agrees_with_the_selector(labels: dict[str, str] | None, unsharded: bool, a: bool, default: bool) -> None:
    body = _sg(labels)
    assert (Shard().owns(body), Shard("a").owns(body), Shard(None, True).owns(body)) == (unsharded, a, default)


def test_each_named_shard_has_its_own_lease() -> None:
    assert Shard().lease_name("servegraph-operator") == "servegraph-operator"
    assert Shard(None, True).lease_name("servegraph-operator") == "servegraph-operator"
    assert Shard("eu-1").lease_name("servegraph-operator") == "servegraph-operator-shard-eu-1"


def test_flags() -> None:
    assert Shard.from_flags(None, False) == Shard()
    assert Shard.from_flags("a", False) == Shard("a")
    assert Shard.from_flags(None, True).default
    with pytest.raises(ValueError, match="--shard and --shard-default exclude each other"):
        Shard.from_flags("a", True)
    for bad in ("", "A", "a_b", "-a", "a" * 64):
        with pytest.raises(ValueError, match=r"is not a DNS label.*--shard-default"):
            Shard.from_flags(bad, False)


def test_the_selector_goes_to_the_servegraph_watch_only() -> None:
    settings = kopf.OperatorSettings()
    configure(settings, Shard("a").selector())
    servegraphs = kopf.Resource(GROUP, VERSION, PLURAL)
    rayservices = kopf.Resource("ray.io", "v1", "rayservices")
    assert list(settings.watching.label_selectors.collect(servegraphs)) == [f"{SHARD_LABEL}=a"]
    assert list(settings.watching.label_selectors.collect(rayservices)) == []
    unsharded = kopf.OperatorSettings()
    configure(unsharded, Shard().selector())
    assert list(unsharded.watching.label_selectors.collect(servegraphs)) == []


async def test_a_servegraph_moved_away_while_its_graph_downloads_gets_nothing_written() -> None:
    c = Cluster()
    c.body["metadata"]["labels"] = {SHARD_LABEL: "a"}
    registry = c.registry

    async def fetcher(request: FetchRequest) -> Fetched:
        c.body["metadata"]["labels"] = {SHARD_LABEL: "b"}
        c.reconciler.servegraph_changed(copy.deepcopy(c.body))  # the watch, meanwhile, as a change
        return await registry(request)

    c.reconciler = Reconciler(c.api, fetcher, Metrics(), c.queue, owns=Shard("a").owns)
    c.watch_servegraph()
    await reconcile_through_downloads(c.reconciler, KEY)
    assert registry.requests, "the download ran"
    assert c.api.writes() == [], c.api.calls
    assert c.api.rayservices == {}
