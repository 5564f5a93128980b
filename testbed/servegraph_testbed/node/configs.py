"""The node's configuration files, as pure functions of its paths and network.

Each setting that is not a default says why; ../shared/NODE.md has how they were found
on this machine kind (cgroup v1, no systemd, a VM that forbids lowering oom_score_adj).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from servegraph_testbed.node.network import NodeNetwork

CLUSTER_DOMAIN = "cluster.local"
BRIDGE = "cni0"  # inside the node's network namespace, so no name clash with the host
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins


@dataclass(frozen=True)
class NodePaths:
    """Everything the node writes lives under one work dir (removed at teardown)."""

    root: Path

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.yaml"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def resolv_conf(self) -> Path:
        return self.root / "resolv.conf"

    @property
    def kube_proxy_config(self) -> Path:
        return self.root / "kube-proxy.yaml"


def containerd_config(paths: NodePaths, sandbox_image: str) -> str:
    """containerd 1.6 config (version 2): all state under the work dir, CRI with our CNI."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{paths.containerd_root}"
state = "{paths.containerd_state}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{paths.containerd_socket}"

[ttrpc]
  address = "{paths.containerd_socket}.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{paths.root / "containerd" / "opt"}"

[{cri}]
  # Nothing can be pulled here: the pause image is imported like every other.
  sandbox_image = "{sandbox_image}"
  # This VM forbids lowering oom_score_adj; without this runc fails with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  enable_cdi = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false  # no systemd here: cgroupfs, as the kubelet

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{paths.cni_conf_dir}"
"""


def cni_conflist(net: NodeNetwork, paths: NodePaths) -> str:
    """A bridge with host-local IPAM on the pod range, then loopback.

    No masquerade: the host routes the pod range back through the node's veth, so pods
    and the host see each other's real addresses. Hairpin lets a pod reach itself
    through its own Service (the Ray head does).
    """
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "servegraph-testbed",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": net.pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(paths.root / "cni-ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        },
        indent=2,
    )


def kubelet_config(net: NodeNetwork, paths: NodePaths, ca_file: Path, cgroup_root: str) -> str:
    """KubeletConfiguration for this machine kind (see NODE.md for each non-default)."""
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # 1.36 refuses cgroup v1 otherwise (KEP-5573)
        "cgroupDriver": "cgroupfs",  # no systemd
        # Every pod cgroup under one root of ours, removed at teardown.
        "cgroupRoot": cgroup_root,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "address": net.node_ip,
        "healthzBindAddress": "127.0.0.1",
        "readOnlyPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [net.dns_ip],
        "clusterDomain": CLUSTER_DOMAIN,
        # Pods with dnsPolicy Default get this, not the host's resolvers.
        "resolvConf": str(paths.resolv_conf),
        "podLogsDir": str(paths.pod_logs),
        # Images were imported, not pulled: never garbage-collect them, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "serializeImagePulls": False,
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,  # kube-proxy owns iptables in this namespace
        "registerNode": True,
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "5s",
        # Fast, clean pod deletion in tests.
        "shutdownGracePeriod": "0s",
    }
    return yaml.safe_dump(config, sort_keys=False)


def kube_proxy_config(net: NodeNetwork, kubeconfig: Path, node_name: str) -> str:
    """kube-proxy in iptables mode, inside the node's network namespace."""
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "bindAddress": net.node_ip,
        "clusterCIDR": net.pod_cidr,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # conntrack limits are global sysctls a network namespace may not write: leave them.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"syncPeriod": "5s", "minSyncPeriod": "0s"},
    }
    return yaml.safe_dump(config, sort_keys=False)


def resolv_conf(net: NodeNetwork) -> str:
    """The node's resolver for dnsPolicy=Default pods: cluster DNS only (no internet here)."""
    return f"nameserver {net.dns_ip}\noptions ndots:1\n"
