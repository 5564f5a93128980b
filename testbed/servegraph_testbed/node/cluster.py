"""A real one-node Kubernetes cluster: the node tier of the test bed.

etcd and kube-apiserver (a ControlPlane in cluster mode), kube-controller-manager
(garbage collector, endpoints, EndpointSlices, ServiceAccounts and their tokens,
Deployments), kube-scheduler, and one node: containerd + runc + the CNI bridge, the
kubelet and kube-proxy in iptables mode, in namespaces of their own (see sandbox.py
and network.py), with CoreDNS as the cluster DNS. Images are imported from the OCI
archives images.py built; nothing is pulled.

    with NodeCluster() as cluster:
        cluster.control_plane.kubectl("get", "nodes")

Teardown removes every process, container, mount, network namespace, veth, route and
cgroup the cluster made, even after a failed start; leftovers() says what (if anything)
is still there.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TextIO

from servegraph_testbed.binaries import Binaries, find_binaries
from servegraph_testbed.controlplane import KEEP_ENV_VAR, ControlPlane
from servegraph_testbed.identities import Identity, default_identities
from servegraph_testbed.images import ImageSet, find_images
from servegraph_testbed.locks import take
from servegraph_testbed.node import cgroups
from servegraph_testbed.node.addons import coredns_manifests
from servegraph_testbed.node.configs import (
    NodePaths,
    cni_conflist,
    containerd_config,
    kube_proxy_config,
    kubelet_config,
    resolv_conf,
)
from servegraph_testbed.node.network import NodeNetwork
from servegraph_testbed.node.sandbox import command as sandbox_command
from servegraph_testbed.processes import Component, ComponentError, stop_at_exit
from servegraph_testbed.rest import JSON_PATCH, ApiError

# One node cluster at a time per machine: two would share 2 CPUs with two Ray clusters
# each and time out. A second start waits for the first to stop.
MACHINE_LOCK = Path("/run/servegraph-testbed-node.lock")
LOCK_WAIT_S = 3600.0

KUBELET = "kubelet"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
KUBE_PROXY = "kube-proxy"


class NodeCluster:
    """Control plane + controllers + one node; use as a context manager or start()/stop()."""

    def __init__(
        self,
        binaries: Binaries | None = None,
        images: ImageSet | None = None,
        *,
        identities: Iterable[Identity] | None = None,
        crds: Sequence[Path] = (),
        audit: bool = False,
        gpus: int = 0,
        ready_timeout: float = 180.0,
    ) -> None:
        """`gpus`: advertise this many `nvidia.com/gpu` on the node (the documented
        extended-resource node-status patch; there is no GPU here, only the scheduling)."""
        self._binaries = binaries
        self._images = images
        self._identities = list(identities) if identities is not None else list(default_identities())
        self._crds = list(crds)
        self._audit = audit
        self.gpus = gpus
        self.ready_timeout = ready_timeout
        self.net: NodeNetwork | None = None
        self.control_plane: ControlPlane | None = None
        self._sandbox: Component | None = None
        self._stopped: tuple[Path, list[int]] | None = None
        self._lock: TextIO | None = None
        self.timings: dict[str, float] = {}

    def __enter__(self) -> NodeCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---- names -----------------------------------------------------------------------

    @property
    def node_name(self) -> str:
        return f"servegraph-node-{self._net.slot}"

    @property
    def cgroup_root(self) -> str:
        return self._net.cgroup_root

    @property
    def _net(self) -> NodeNetwork:
        if self.net is None:
            raise RuntimeError("node cluster not started")
        return self.net

    @property
    def cp(self) -> ControlPlane:
        if self.control_plane is None:
            raise RuntimeError("node cluster not started")
        return self.control_plane

    @property
    def images(self) -> ImageSet:
        if self._images is None:
            raise RuntimeError("node cluster not started")
        return self._images

    @property
    def paths(self) -> NodePaths:
        return NodePaths(self.cp.workdir / "node")

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> NodeCluster:
        """Network, control plane, controllers, node, images, DNS; waits until all are ready.

        On any failure everything started so far is removed before the error propagates.
        """
        binaries = (self._binaries or find_binaries()).check_node()
        self._lock = take(
            MACHINE_LOCK,
            wait_s=LOCK_WAIT_S,
            waiting="node tier: waiting for another node cluster on this machine to stop",
            holder="another node cluster",
        )
        stop_at_exit(self.stop)  # an interrupted run still removes the network and cgroups
        t0 = time.monotonic()
        self._binaries = binaries
        self._images = self._images or find_images(binaries)
        try:
            self.net = net = NodeNetwork.create()
            node_identities = [
                Identity(KUBELET, f"system:node:{self.node_name}", ("system:nodes",)),
                Identity(CONTROLLER_MANAGER, "system:kube-controller-manager"),
                Identity(SCHEDULER, "system:kube-scheduler"),
                Identity(KUBE_PROXY, "system:kube-proxy"),
            ]
            self.control_plane = ControlPlane(
                binaries,
                identities=[*self._identities, *node_identities],
                crds=self._crds,
                audit=self._audit,
                host=net.host_ip,
                service_cidr=net.service_cidr,
                cluster=True,
            ).start()
            self._mark("control plane", t0)
            self._start_controllers(binaries)
            self._start_node(binaries)
            self._mark("node process", t0)
            self._import_images()
            self._mark("images imported", t0)
            self._wait_node_ready()
            self._mark("node Ready", t0)
            if self.gpus:
                self._advertise_gpus()
            self._start_dns()
            self._mark("CoreDNS ready", t0)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the node (all its containers with it), the controllers, the control plane;
        then remove the cgroup root and the network. Safe to call twice."""
        atexit.unregister(self.stop)
        errors: list[BaseException] = []
        if self.control_plane is not None:
            self._stopped = (self.control_plane.workdir, list(self.control_plane.pids.values()))
            try:
                self.control_plane.stop()  # spawned components first: node, scheduler, controllers
            except Exception as e:
                errors.append(e)
        if self.net is not None:
            left = cgroups.remove(self.cgroup_root)
            if left:
                errors.append(RuntimeError(f"cgroups still busy after teardown: {left[:5]}"))
            self.net.delete()
        self._sandbox = None
        self.control_plane = None  # self.net stays: leftovers() reports on it
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None
        if errors:
            raise errors[0]

    def leftovers(self) -> list[str]:
        """What the stopped cluster left on the host: processes, mounts, namespaces, links,
        routes, cgroups (empty when teardown was complete)."""
        if self.net is None or self._stopped is None:
            return []
        workdir, pids = self._stopped
        found = self.net.leftovers() + [f"cgroup {c}" for c in cgroups.leftovers(self.cgroup_root)]
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        found += [f"mount {m.split()[4]}" for m in mounts if str(workdir) in m or "/run/netns/cni-" in m]
        ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=False).stdout
        found += [f"process {line.strip()}" for line in ps.splitlines() if str(workdir) in line]
        found += [f"process group {pid}" for pid in pids if _alive(pid)]
        if workdir.exists() and os.environ.get(KEEP_ENV_VAR) != "1":
            found.append(f"directory {workdir}")
        return found

    # ---- steps ---------------------------------------------------------------------------

    def _mark(self, step: str, t0: float) -> None:
        self.timings[step] = round(time.monotonic() - t0, 2)

    def _start_controllers(self, binaries: Binaries) -> None:
        cp = self.cp
        pki_dir = cp.ca_file.parent
        cp.spawn(
            CONTROLLER_MANAGER,
            [
                str(binaries.kube_controller_manager),
                f"--kubeconfig={cp.kubeconfig(CONTROLLER_MANAGER)}",
                f"--root-ca-file={cp.ca_file}",
                f"--service-account-private-key-file={pki_dir / 'sa.key'}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--secure-port=0",
                f"--cluster-cidr={self._net.pod_cidr}",
                f"--service-cluster-ip-range={self._net.service_cidr}",
                # Fast reaction to a node or pod that went away (the tests kill pods).
                "--node-monitor-grace-period=20s",
                "--concurrent-gc-syncs=5",
            ],
            identity=None,
        )
        cp.spawn(
            SCHEDULER,
            [
                str(binaries.kube_scheduler),
                f"--kubeconfig={cp.kubeconfig(SCHEDULER)}",
                "--leader-elect=false",
                "--secure-port=0",
            ],
            identity=None,
        )

    def _start_node(self, binaries: Binaries) -> None:
        cp, net, paths = self.cp, self._net, self.paths
        for d in (paths.root, paths.cni_conf_dir, paths.kubelet_root, paths.pod_logs):
            d.mkdir(parents=True, exist_ok=True)
        paths.containerd_config.write_text(containerd_config(paths, self.images.ref("pause")))
        (paths.cni_conf_dir / "10-servegraph.conflist").write_text(cni_conflist(net, paths))
        paths.kubelet_config.write_text(kubelet_config(net, paths, cp.ca_file, "/" + self.cgroup_root))
        paths.resolv_conf.write_text(resolv_conf(net))
        paths.kube_proxy_config.write_text(kube_proxy_config(net, cp.kubeconfig(KUBE_PROXY), self.node_name))
        cgroups.create(self.cgroup_root)
        spec = {
            "logs": str(cp.workdir),
            "containerd_socket": str(paths.containerd_socket),
            "containerd": ["containerd", f"--config={paths.containerd_config}"],
            "kubelet": [
                str(binaries.kubelet),
                f"--config={paths.kubelet_config}",
                f"--kubeconfig={cp.kubeconfig(KUBELET)}",
                f"--hostname-override={self.node_name}",
                f"--node-ip={net.node_ip}",
                f"--root-dir={paths.kubelet_root}",
                "--v=1",
            ],
            "kube-proxy": [str(binaries.kube_proxy), f"--config={paths.kube_proxy_config}"],
        }
        spec_file = paths.root / "sandbox.json"
        spec_file.write_text(json.dumps(spec, indent=2))
        self._sandbox = sandbox = cp.spawn("node", sandbox_command(net.netns_path, spec_file), identity=None)
        deadline = time.monotonic() + 60
        while not paths.containerd_socket.exists():
            if not sandbox.running:
                raise self._node_error("the node exited while starting containerd")
            if time.monotonic() > deadline:
                raise self._node_error("containerd did not create its socket within 60 s")
            time.sleep(0.1)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """containerd's `ctr` against the node (namespace k8s.io, the CRI's)."""
        argv = ["ctr", f"--address={self.paths.containerd_socket}", "--namespace=k8s.io", *args]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if check and proc.returncode != 0:
            raise self._node_error(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def _import_images(self) -> None:
        for archive in self.images.archives.values():
            self.ctr("images", "import", "--all-platforms", str(archive))

    def _wait_node_ready(self) -> None:
        path = f"/api/v1/nodes/{self.node_name}"
        deadline = time.monotonic() + self.ready_timeout
        last = "not registered"
        while time.monotonic() < deadline:
            self._check_node_alive()
            try:
                node = self.cp.rest().request("GET", path)
            except ApiError as e:
                last = str(e)
            else:
                ready = [c for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
                if ready and ready[0]["status"] == "True":
                    return
                last = json.dumps(ready[0]) if ready else "no Ready condition yet"
            time.sleep(0.5)
        raise self._node_error(f"node {self.node_name} not Ready after {self.ready_timeout:.0f} s (last: {last})")

    def _advertise_gpus(self) -> None:
        """The documented way to advertise an extended resource: a JSON patch of node status."""
        patch = [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(self.gpus)}]
        self.cp.rest().request("PATCH", f"/api/v1/nodes/{self.node_name}/status", patch, JSON_PATCH)

    def _start_dns(self) -> None:
        cp = self.cp
        cp.kubectl("apply", "-f", "-", stdin=coredns_manifests(self.images.ref("coredns"), self._net.dns_ip))
        self.wait_rollout("kube-system", "deployment/coredns")

    def wait_rollout(self, namespace: str, what: str, timeout: float | None = None) -> None:
        """`kubectl rollout status`, with the node's health checked when it fails."""
        limit = timeout or self.ready_timeout
        out = self.cp.kubectl("rollout", "status", "-n", namespace, what, f"--timeout={limit:.0f}s", check=False)
        if out.returncode != 0:
            pods = self.cp.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
            events = self.cp.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout
            # What the containers said (a crash loop's reason is in the previous run's log).
            logs = "\n".join(
                self.cp.kubectl(
                    "logs", "-n", namespace, what, "--all-containers", "--tail=30", *last, check=False
                ).stdout
                for last in ((), ("--previous",))
            )
            raise self._node_error(
                f"{namespace}/{what} not rolled out in {limit:.0f} s: {out.stderr.strip()}\n{pods}\n{events[-3000:]}"
                f"\n--- container logs ---\n{logs[-4000:]}"
            )

    def kill_container(self, namespace: str, pod: str, sig: signal.Signals = signal.SIGKILL) -> list[int]:
        """Signal every process of a pod's first container, as a crash would (no API call,
        no grace period: the kubelet sees the container die and restarts it). Found through
        the container's cgroup, whose cgroup.procs lists host pids."""
        obj = self.cp.rest().get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
        container_id = obj["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        pids = cgroups.container_pids(self.cgroup_root, container_id)
        if not pids:
            raise LookupError(f"no processes found for container {container_id} of {namespace}/{pod}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def _check_node_alive(self) -> None:
        if self._sandbox is not None and not self._sandbox.running:
            raise self._node_error("the node's process exited")

    def _node_error(self, reason: str) -> ComponentError:
        tails = []
        for name in ("node", "containerd", "kubelet", "kube-proxy"):
            log = self.cp.component_log(name)
            if log.exists():
                lines = log.read_text(errors="replace").splitlines()[-25:]
                tails.append(f"--- {name} ---\n" + "\n".join(lines))
        return ComponentError("node", reason, "\n".join(tails))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
