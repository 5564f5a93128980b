"""What applying a new RayService will make KubeRay do, predicted from the two manifests (pure).

The rules are KubeRay v1.6.2's own (controllers/ray/rayservice_controller.go:
`shouldPrepareNewCluster`, `shouldUpdateCluster`, `isClusterSpecHashEqual`, and
utils.GenerateHashWithoutReplicasAndWorkersToDelete):

- The cluster spec is compared without worker replicas, min/max replicas,
  workersToDelete, tolerations, scheduling gates and the upgrade strategy.
- Equal: the running cluster stays as it is; a changed serveConfigV2 is pushed to it
  in place. (Replica counts alone are not propagated to the RayCluster.)
- Equal once the new spec's worker groups are cut to the old count (groups only
  appended): KubeRay updates the running cluster in place, adding the groups.
- Otherwise, with a zero-downtime strategy (`NewCluster`, the default, or
  `NewClusterWithIncrementalUpgrade`): a whole new cluster next to the old one until
  its applications are RUNNING — twice the pods at the peak. With `None`: nothing
  happens to the cluster at all.

`servegraph diff` prints the prediction; the operator posts it before applying an
upgrade that needs a new cluster.

Cheap on purpose: the operator predicts in its own process before every apply of a
changed RayService. The cluster specs are compared as the structures they are, the Serve
configs only as text (equal or not); what changes per application is read from the Serve
config structures the renderer made the texts from (`render_serve_config`), never by
parsing the multi-MiB YAML again (that cost seconds of CPU at 10,000 nodes); a side known
only as text is read back by `serve_text`, 0.17 s at 10,000 nodes where libyaml took 2.8 s.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from servegraph.render.serve_text import read_config

SERVE_ONLY = "ServeConfigInPlace"
NO_CHANGE = "NoChange"
CLUSTER_IN_PLACE = "ClusterUpdatedInPlace"
NEW_CLUSTER = "NewCluster"
NOT_APPLIED = "ClusterChangeNotApplied"
CREATE = "Create"

# Kubernetes' quantity grammar (apimachinery resource.ParseQuantity): a signed decimal
# number, then a binary suffix, a decimal suffix or a decimal exponent with an integer.
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)
_DECIMAL_SUFFIX = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIX = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
# Kubernetes takes any int64 exponent; a number past 10^±400 is a float's inf or 0.
_FLOAT_EXPONENT = 400


@dataclass(frozen=True)
class Resources:
    """Requests summed over pods: what the scheduler must find room for."""

    pods: int = 0
    cpus: float = 0.0
    memory_bytes: float = 0.0
    gpus: float = 0.0

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.pods + other.pods,
            self.cpus + other.cpus,
            self.memory_bytes + other.memory_bytes,
            self.gpus + other.gpus,
        )

    def describe(self) -> str:
        gib = self.memory_bytes / 2**30
        return f"{self.pods} pods, {self.cpus:g} CPUs, {gib:g} GiB, {self.gpus:g} GPUs"


@dataclass(frozen=True)
class AppChange:
    name: str
    change: str  # added, removed, changed
    details: tuple[str, ...] = ()


@dataclass(frozen=True)
class Prediction:
    kind: str
    reasons: tuple[str, ...]
    extra_at_peak: Resources
    """Pods and requests that exist only during the upgrade (a new cluster, new groups)."""
    applications: tuple[AppChange, ...] = field(default_factory=tuple)

    @property
    def new_cluster(self) -> bool:
        return self.kind == NEW_CLUSTER

    def summary(self) -> str:
        what = {
            CREATE: "creates the RayService and its first Ray cluster",
            NO_CHANGE: "changes nothing KubeRay acts on",
            SERVE_ONLY: "updates the Serve applications in place (same Ray cluster, no pod restarted)",
            CLUSTER_IN_PLACE: "adds worker groups to the running Ray cluster in place",
            NEW_CLUSTER: "starts a new Ray cluster beside the running one and switches traffic when it is ready",
            NOT_APPLIED: "changes the cluster spec, which KubeRay does not apply with upgradeStrategy None",
        }[self.kind]
        extra = f"; extra at the peak: {self.extra_at_peak.describe()}" if self.extra_at_peak.pods else ""
        return f"{what}{extra}"


def predict(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    *,
    old_config: Mapping[str, Any] | None = None,
    new_config: Mapping[str, Any] | None = None,
    applications: bool = True,
) -> Prediction:
    """What KubeRay v1.6.2 does when the live RayService `old` becomes `new`.

    `old_config` and `new_config` are the Serve config structures the manifests'
    serveConfigV2 texts were rendered from: the per-application changes are read from
    them. A side given only as text (`servegraph diff` against a live RayService) is
    read as YAML; the operator asks for no per-application changes (`applications=False`)
    and so never reads YAML here.
    """
    new_spec = new.get("spec") or {}
    apps: tuple[AppChange, ...] = ()
    if applications:
        old_text = ((old or {}).get("spec") or {}).get("serveConfigV2")
        if old is None or old_text != new_spec.get("serveConfigV2"):
            before = old_config if old_config is not None else _read_config(old)
            after = new_config if new_config is not None else _read_config(new)
            apps = tuple(application_changes(before, after))
    if old is None:
        return Prediction(CREATE, ("no RayService yet",), cluster_resources(new_spec["rayClusterConfig"]), apps)
    old_spec = old.get("spec") or {}
    new_cluster = new_spec.get("rayClusterConfig") or {}
    old_raw = old_spec.get("rayClusterConfig") or {}
    old_cluster = project(old_raw, new_cluster)
    if _muted(old_cluster) == _muted(new_cluster):
        serve_changed = old_spec.get("serveConfigV2") != new_spec.get("serveConfigV2")
        kind = SERVE_ONLY if serve_changed else NO_CHANGE
        reasons = ("the Ray cluster's spec is unchanged",) + (("serveConfigV2 changed",) if serve_changed else ())
        return Prediction(kind, reasons, Resources(), apps)
    reasons = tuple(cluster_differences(old_cluster, new_cluster))
    old_groups = old_cluster.get("workerGroupSpecs") or []
    new_groups = new_cluster.get("workerGroupSpecs") or []
    if len(new_groups) > len(old_groups):
        cut = {**new_cluster, "workerGroupSpecs": new_groups[: len(old_groups)]}
        if _muted(cut) == _muted(project(old_raw, cut)):
            added = Resources()
            for group in new_groups[len(old_groups) :]:
                added += _group_resources(group)
            return Prediction(CLUSTER_IN_PLACE, reasons, added, apps)
    strategy = (new_spec.get("upgradeStrategy") or {}).get("type") or "NewCluster"
    if strategy == "None":
        return Prediction(NOT_APPLIED, reasons, Resources(), apps)
    return Prediction(NEW_CLUSTER, reasons, cluster_resources(new_cluster), apps)


def stable_worker_groups(previous: Mapping[str, Any], canonical: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The canonical worker groups in the order the running cluster has them.

    Groups it already has keep their place; new ones are appended; one no longer used
    stays, parked at zero workers, so that adding a hardware class or moving a node
    between classes is an in-place update for KubeRay instead of a new cluster. When
    the head or a kept group changes anyway (a new cluster is coming regardless), the
    canonical list is returned: the new cluster starts clean, without parked groups.
    """
    wanted = [dict(g) for g in canonical.get("workerGroupSpecs") or []]
    kept = list(previous.get("workerGroupSpecs") or [])
    by_name = {g["groupName"]: g for g in wanted}
    ordered: list[dict[str, Any]] = []
    for group in kept:
        name = group.get("groupName")
        if name in by_name:
            ordered.append(by_name.pop(name))
        else:
            ordered.append({**copy.deepcopy(dict(group)), "replicas": 0, "minReplicas": 0, "maxReplicas": 0})
    ordered += [g for g in wanted if g["groupName"] in by_name]
    cut = {**canonical, "workerGroupSpecs": ordered[: len(kept)]}
    if _muted(project(previous, cut)) != _muted(cut):
        return wanted
    return ordered


def project(live: Any, shape: Any) -> Any:
    """`live` cut to the keys `shape` has: what the API server and KubeRay add (schema
    defaults, status-like fields) does not count as a difference. Lists of another
    length are kept whole (they differ anyway)."""
    if isinstance(shape, Mapping) and isinstance(live, Mapping):
        return {k: project(live[k], v) for k, v in shape.items() if k in live}
    if isinstance(shape, list) and isinstance(live, list) and len(shape) == len(live):
        return [project(a, b) for a, b in zip(live, shape, strict=True)]
    return live


def _muted(cluster: Mapping[str, Any]) -> bytes:
    """The cluster spec as KubeRay hashes it: replicas, scheduling extras and strategy left out."""
    spec = copy.deepcopy(dict(cluster))
    spec.pop("upgradeStrategy", None)
    head = ((spec.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
    head.pop("tolerations", None)
    head.pop("schedulingGates", None)
    for group in spec.get("workerGroupSpecs") or []:
        for key in ("replicas", "minReplicas", "maxReplicas"):
            group.pop(key, None)
        (group.get("scaleStrategy") or {}).pop("workersToDelete", None)
        pod = (group.get("template") or {}).get("spec") or {}
        pod.pop("tolerations", None)
        pod.pop("schedulingGates", None)
    return orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)


def cluster_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> Iterable[str]:
    """Human-readable reasons the cluster specs differ (what forces KubeRay's hand)."""
    if old.get("rayVersion") != new.get("rayVersion"):
        yield f"rayVersion {old.get('rayVersion')} -> {new.get('rayVersion')}"
    if old.get("enableInTreeAutoscaling") != new.get("enableInTreeAutoscaling"):
        yield "in-tree autoscaling turned " + ("on" if new.get("enableInTreeAutoscaling") else "off")
    elif old.get("autoscalerOptions") != new.get("autoscalerOptions"):
        yield "autoscalerOptions changed"
    if orjson.dumps(old.get("headGroupSpec"), option=orjson.OPT_SORT_KEYS) != orjson.dumps(
        new.get("headGroupSpec"), option=orjson.OPT_SORT_KEYS
    ):
        yield "head group changed"
    old_groups = [g.get("groupName") for g in old.get("workerGroupSpecs") or []]
    new_groups = [g.get("groupName") for g in new.get("workerGroupSpecs") or []]
    if old_groups != new_groups:
        yield f"worker groups {old_groups} -> {new_groups}"
    by_name = {g.get("groupName"): g for g in old.get("workerGroupSpecs") or []}
    for group in new.get("workerGroupSpecs") or []:
        before = by_name.get(group.get("groupName"))
        if before is not None and _muted({"workerGroupSpecs": [before]}) != _muted({"workerGroupSpecs": [group]}):
            yield f"worker group {group.get('groupName')} changed"


def cluster_resources(cluster: Mapping[str, Any]) -> Resources:
    """Requests of the head and every worker group at its initial size."""
    head = Resources(1, *_pod_requests((cluster.get("headGroupSpec") or {}).get("template") or {}))
    total = head
    for group in cluster.get("workerGroupSpecs") or []:
        total += _group_resources(group)
    return total


def _group_resources(group: Mapping[str, Any]) -> Resources:
    count = int(group.get("replicas", group.get("minReplicas", 0)) or 0)
    cpus, memory, gpus = _pod_requests(group.get("template") or {})
    return Resources(count, cpus * count, memory * count, gpus * count)


def _pod_requests(template: Mapping[str, Any]) -> tuple[float, float, float]:
    cpus = memory = gpus = 0.0
    for container in (template.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        values = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        cpus += _requested(values.get("cpu", 0))
        memory += _requested(values.get("memory", 0))
        gpus += _requested(values.get("nvidia.com/gpu", 0))
    return cpus, memory, gpus


def _requested(value: Any) -> float:
    """A request as a number for the peak estimate; one the API server will refuse counts as
    nothing here: the apply names the bad value, a prediction must not fail the reconcile."""
    try:
        return parse_quantity(value)
    except ValueError:
        return 0.0


def parse_quantity(value: Any) -> float:
    """A Kubernetes quantity ("300m", "2", "16Gi", "2e9", "12E", 4) as a number.

    Every form Kubernetes accepts for a resource request (its suffixes n u m k M G T P E,
    Ki to Ei, and decimal exponents); ValueError naming the value for any other, and for
    a negative one (a request cannot be).
    """
    if isinstance(value, str) and len(value) <= _CACHED_LENGTH:
        return _short_quantity(value)
    return _quantity(value)


_CACHED_LENGTH = 32


@functools.lru_cache(maxsize=1024)
def _short_quantity(value: str) -> float:
    """The few quantities a cluster's pods use, each parsed once (~2 µs by Decimal; the
    operator reads every pod's requests on each render and upgrade prediction)."""
    return _quantity(value)


def _quantity(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    if isinstance(value, int | float):
        if value < 0 or value != value:
            raise ValueError(f"not a Kubernetes quantity a request may have: {value!r}")
        return float(value)
    m = _QUANTITY.fullmatch(value)
    if m is None:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    number = Decimal(m["number"])
    if number < 0:
        raise ValueError(f"not a Kubernetes quantity a request may have: {value!r} is negative")
    if m["binary"]:
        return float(number * 2 ** _BINARY_SUFFIX[m["binary"]])
    try:
        exponent = int(m["exponent"]) if m["exponent"] else _DECIMAL_SUFFIX.get(m["decimal"] or "", 0)
    except ValueError:  # thousands of digits
        exponent = 2**63
    if not -(2**63) <= exponent < 2**63:  # Kubernetes reads the exponent as an int64
        raise ValueError(f"not a Kubernetes quantity: {value!r} (exponent out of range)")
    magnitude = number.adjusted() + exponent
    if not number or magnitude < -_FLOAT_EXPONENT:
        return 0.0
    if magnitude > _FLOAT_EXPONENT:
        return float("inf")
    try:
        return float(number.scaleb(exponent))
    except InvalidOperation:  # an exponent matched by a number of millions of digits
        raise ValueError(f"not a Kubernetes quantity: {value!r} (exponent out of range)") from None


def application_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> Iterable[AppChange]:
    """Per application and deployment: what changes between two Serve config structures."""
    before = _apps(old)
    after = _apps(new)
    for name in sorted(before.keys() | after.keys()):
        if name not in before:
            yield AppChange(name, "added", tuple(f"deployment {d}" for d in sorted(_deployments(after[name]))))
        elif name not in after:
            yield AppChange(name, "removed")
        elif before[name] != after[name]:
            yield AppChange(name, "changed", tuple(_app_details(before[name], after[name])))


def _read_config(rayservice: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The Serve config of a RayService known only as a manifest (a live one), read back
    from its text (`serve_text`: fast for the renderer's layout, YAML's answer always)."""
    return read_config(((rayservice or {}).get("spec") or {}).get("serveConfigV2") or "")


def _apps(config: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    return {a["name"]: a for a in (config or {}).get("applications") or [] if isinstance(a, Mapping) and "name" in a}


def _deployments(app: Mapping[str, Any]) -> dict[str, Any]:
    return {d["name"]: d for d in app.get("deployments") or []}


def _app_details(old: Mapping[str, Any], new: Mapping[str, Any]) -> Iterable[str]:
    for key in ("route_prefix", "import_path", "runtime_env"):
        if old.get(key) != new.get(key):
            yield f"{key} changed"
    old_nodes = _nodes(old)
    new_nodes = _nodes(new)
    old_deps, new_deps = _deployments(old), _deployments(new)
    for name in sorted(old_deps.keys() | new_deps.keys() | old_nodes.keys() | new_nodes.keys()):
        if name not in old_deps and name not in old_nodes:
            yield f"deployment {name} added"
        elif name not in new_deps and name not in new_nodes:
            yield f"deployment {name} removed"
        else:
            fields = sorted(
                k
                for k in (old_deps.get(name, {}).keys() | new_deps.get(name, {}).keys()) - {"name"}
                if old_deps.get(name, {}).get(k) != new_deps.get(name, {}).get(k)
            )
            if old_nodes.get(name) != new_nodes.get(name):
                fields.insert(0, "code or wiring")
            if fields:
                yield f"deployment {name}: {', '.join(fields)}"


def _nodes(app: Mapping[str, Any]) -> dict[str, Any]:
    """The DAG nodes in the application's args (servegraph.dag.args), by node id."""
    args = app.get("args") or {}
    nodes = args.get("nodes") if isinstance(args, Mapping) else None
    if isinstance(nodes, Mapping):
        return dict(nodes)
    if isinstance(nodes, list):
        return {n.get("id", str(i)): n for i, n in enumerate(nodes) if isinstance(n, Mapping)}
    return {}
