"""The schema probe tells the KubeRay releases apart on their own CRDs (both, from their modules)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from servegraph.render.kuberay_features import KubeRayFeatures, NotARayServiceCRD
from servegraph_testbed import find_manifests


def _crd(previous: bool) -> dict[str, Any]:
    binaries = find_manifests()
    crds = (binaries.kuberay_previous if previous else binaries).kuberay_crds
    crd: dict[str, Any] = yaml.load((crds / "ray.io_rayservices.yaml").read_text(), Loader=yaml.CSafeLoader)
    return crd


@pytest.fixture(scope="module")
def current() -> dict[str, Any]:
    return _crd(previous=False)


@pytest.fixture(scope="module")
def previous() -> dict[str, Any]:
    return _crd(previous=True)


def test_the_current_kuberay_offers_suspend_ingress_options_and_the_incremental_upgrade_on(
    current: dict[str, Any],
) -> None:
    assert KubeRayFeatures.from_crd(current) == KubeRayFeatures(
        suspend=True, ingress_options=True, incremental_upgrade=True, incremental_upgrade_by_default=True
    )
    assert KubeRayFeatures.from_crd(current).refusals(suspend=True, incremental_upgrade=True) == []


def test_the_previous_kuberay_has_the_incremental_type_but_no_suspend_and_the_gate_off(
    previous: dict[str, Any],
) -> None:
    features = KubeRayFeatures.from_crd(previous)
    assert features == KubeRayFeatures(
        suspend=False, ingress_options=False, incremental_upgrade=True, incremental_upgrade_by_default=False
    )
    assert features.refusals(suspend=True) == [
        "the installed KubeRay's RayService has no spec.suspend (KubeRay 1.7 or later)"
    ]


def test_a_crd_without_the_upgrade_options_has_no_incremental_upgrade(current: dict[str, Any]) -> None:
    crd = copy.deepcopy(current)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    del v1["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["upgradeStrategy"]["properties"][
        "clusterUpgradeOptions"
    ]
    features = KubeRayFeatures.from_crd(crd)
    assert not features.incremental_upgrade
    assert "does not offer NewClusterWithIncrementalUpgrade" in features.refusals(incremental_upgrade=True)[0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda crd: crd["metadata"].update(name="rayclusters.ray.io"), "got CustomResourceDefinition rayclusters"),
        (lambda crd: crd.update(kind="ConfigMap"), "got ConfigMap"),
        (lambda crd: [v.update(served=False) for v in crd["spec"]["versions"]], "serves no version v1"),
    ],
    ids=["another CRD", "not a CRD", "v1 not served"],
)
def test_anything_else_is_refused_by_name(current: dict[str, Any], change: Any, message: str) -> None:
    crd = copy.deepcopy(current)
    change(crd)
    with pytest.raises(NotARayServiceCRD, match=message):
        KubeRayFeatures.from_crd(crd)
