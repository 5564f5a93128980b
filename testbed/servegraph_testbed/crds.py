"""Installing CustomResourceDefinitions and waiting until clients can really use them.

Established alone is not enough: for a moment after it the group/version may still be
missing from discovery, and clients that resolve kinds through discovery then fail.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from servegraph_testbed.rest import ApiError, Json, Rest

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
# KubeRay's CRDs are 4 MB of YAML: the pure-Python parser needs ~12 s for them, libyaml ~1 s.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_crds(paths: Iterable[Path]) -> list[Json]:
    """Every CustomResourceDefinition in the given YAML files and directories (recursively).

    Other documents (kustomization.yaml, RBAC, ...) are skipped, so `config/crd/` can be
    passed whole.
    """
    crds: list[Json] = []
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(path)
        candidates = [path] if path.is_file() else path.rglob("*")
        files = sorted(p for p in candidates if p.suffix in {".yaml", ".yml"})
        for file in files:
            stat = file.stat()
            crds += [json.loads(text) for text in _crds_in(file, stat.st_mtime_ns, stat.st_size)]
    return crds


@functools.lru_cache(maxsize=64)
def _crds_in(file: Path, mtime_ns: int, size: int) -> tuple[str, ...]:
    """Parsed once per file version (as JSON text, so callers get fresh objects)."""
    docs = yaml.load_all(file.read_text(), Loader=_Loader)  # a safe loader
    return tuple(json.dumps(doc, sort_keys=True) for doc in docs if _is_crd(doc))


def _is_crd(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and doc.get("kind") == "CustomResourceDefinition"
        and str(doc.get("apiVersion", "")).startswith("apiextensions.k8s.io/")
    )


def install_crds(rest: Rest, crds: Iterable[Json], timeout: float = 30.0) -> list[str]:
    """Server-side apply each CRD, then wait until all are Established and discoverable."""
    names = []
    for crd in crds:
        name = crd["metadata"]["name"]
        rest.apply(f"{CRD_PATH}/{name}", crd)
        names.append(name)
    deadline = time.monotonic() + timeout
    for crd in crds:
        _wait_usable(rest, crd, deadline)
    return names


def _wait_usable(rest: Rest, crd: Json, deadline: float) -> None:
    name = crd["metadata"]["name"]
    group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
    versions = [v["name"] for v in crd["spec"]["versions"] if v.get("served", True)]
    state = "not checked"
    while time.monotonic() < deadline:
        obj = rest.get(f"{CRD_PATH}/{name}")
        conditions = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        established = conditions.get("Established", {}).get("status") == "True"
        if established and all(_discoverable(rest, group, v, plural) for v in versions):
            return
        state = "; ".join(f"{t}={c['status']} {c.get('message', '')}" for t, c in conditions.items())
        time.sleep(0.1)
    raise TimeoutError(f"CRD {name} not usable in time ({state or 'no conditions yet'})")


def _discoverable(rest: Rest, group: str, version: str, plural: str) -> bool:
    try:
        resources = rest.get(f"/apis/{group}/{version}").get("resources", [])
    except ApiError as e:
        if e.status == 404:
            return False
        raise
    return any(r.get("name") == plural for r in resources)
