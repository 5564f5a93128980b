"""The node's own network namespace, wired to the host by one veth pair.

containerd, the kubelet and kube-proxy run inside it, so the CNI bridge, every pod's
veth and every iptables rule kube-proxy writes live there and nowhere else: deleting the
namespace at teardown removes all of them at once, and the host's iptables are never
touched. The host keeps only its end of the veth and two routes through it (to the pod
and Service ranges), which vanish with the veth.

Each NodeNetwork takes a free slot k (0..49) and derives everything from it:

    link      10.234.k.0/30   host 10.234.k.1 (API server, registry) ── node 10.234.k.2
    pods      10.235.k.0/24   the CNI bridge's range
    services  10.236.k.0/24   the API server's Service range (kube-dns at .10)
"""

from __future__ import annotations

import contextlib
import ipaddress
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from servegraph_testbed.locks import exclusive
from servegraph_testbed.node import cgroups

SLOTS = 50
LOCK = Path("/run/servegraph-testbed.lock")
NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    """A network step failed; the message carries the command and its error."""


@dataclass(frozen=True)
class NodeNetwork:
    slot: int

    @property
    def netns(self) -> str:
        return f"sgnode-{self.slot}"

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns

    @property
    def cgroup_root(self) -> str:
        """The node's cgroup root (the kubelet's cgroupRoot) in every hierarchy."""
        return f"servegraph-node-{self.slot}"

    @property
    def host_veth(self) -> str:
        return f"sgh{self.slot}"

    @property
    def node_veth(self) -> str:
        return f"sgn{self.slot}"

    @property
    def host_ip(self) -> str:
        return f"10.234.{self.slot}.1"

    @property
    def node_ip(self) -> str:
        return f"10.234.{self.slot}.2"

    @property
    def pod_cidr(self) -> str:
        return f"10.235.{self.slot}.0/24"

    @property
    def service_cidr(self) -> str:
        return f"10.236.{self.slot}.0/24"

    @property
    def dns_ip(self) -> str:
        return f"10.236.{self.slot}.10"

    @property
    def gateway_ip(self) -> str:
        """The Gateway API implementation's Service (node/gateway.py), fixed like kube-dns's."""
        return f"10.236.{self.slot}.20"

    def in_pod_network(self, address: str) -> bool:
        """True for addresses of this node's pods and Services (where tests may send traffic)."""
        ip = ipaddress.ip_address(address)
        return ip in ipaddress.ip_network(self.pod_cidr) or ip in ipaddress.ip_network(self.service_cidr)

    # ---- lifecycle -----------------------------------------------------------------

    @classmethod
    def create(cls) -> NodeNetwork:
        """Take a free slot and build the namespace, the veth pair, addresses and routes.

        A slot whose namespace holds no process is the leftover of a run that was killed
        before its teardown (SIGKILL, a lost machine): it is removed first, with its
        cgroup root — by the names this module gave them, never by a pattern."""
        with exclusive(LOCK):
            for slot in range(SLOTS):
                stale = cls(slot)
                if stale.netns_path.exists() and not stale.processes():
                    stale.delete()
                    cgroups.remove(stale.cgroup_root, timeout=5)
            taken = _ranges_in_use()
            for slot in range(SLOTS):
                net = cls(slot)
                if net.netns_path.exists() or _link_exists(net.host_veth):
                    continue
                mine = [ipaddress.ip_network(c) for c in (f"10.234.{slot}.0/30", net.pod_cidr, net.service_cidr)]
                if any(m.overlaps(t) for m in mine for t in taken):
                    continue
                try:
                    net._build()
                except BaseException:
                    net.delete()
                    raise
                return net
        raise NetworkError(f"no free node network slot of {SLOTS} (ip netns list; ip route)")

    def _build(self) -> None:
        ns = ["ip", "-n", self.netns]
        _ip(["ip", "netns", "add", self.netns])
        _ip(["ip", "link", "add", self.host_veth, "type", "veth", "peer", "name", self.node_veth])
        _ip(["ip", "link", "set", self.node_veth, "netns", self.netns])
        _ip(["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_veth])
        _ip(["ip", "link", "set", self.host_veth, "up"])
        _ip([*ns, "link", "set", "lo", "up"])
        _ip([*ns, "addr", "add", f"{self.node_ip}/30", "dev", self.node_veth])
        _ip([*ns, "link", "set", self.node_veth, "up"])
        _ip([*ns, "route", "add", "default", "via", self.host_ip])
        for cidr in (self.pod_cidr, self.service_cidr):
            _ip(["ip", "route", "add", cidr, "via", self.node_ip, "dev", self.host_veth])
        # Inside the node only: forward between the veth and the pod bridge, and let
        # iptables see bridged traffic (kube-proxy's Service rules for pod-to-pod traffic).
        for key, value in (
            ("net/ipv4/ip_forward", "1"),
            ("net/bridge/bridge-nf-call-iptables", "1"),
            ("net/ipv4/conf/all/route_localnet", "1"),
        ):
            self.run(["sh", "-c", f"echo {value} > /proc/sys/{key}"])

    def delete(self) -> None:
        """Remove the namespace (its bridge, veths and iptables go with it) and our veth."""
        if self.netns_path.exists():
            subprocess.run(["ip", "netns", "delete", self.netns], capture_output=True, check=False)
        if _link_exists(self.host_veth):
            subprocess.run(["ip", "link", "delete", self.host_veth], capture_output=True, check=False)

    def processes(self) -> list[int]:
        """Pids of the processes in the node's network namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True, check=False).stdout
        return [int(p) for p in out.split()]

    def leftovers(self) -> list[str]:
        """What of this network still exists on the host (empty after delete())."""
        found = []
        if self.netns_path.exists():
            found.append(f"network namespace {self.netns}")
        if _link_exists(self.host_veth):
            found.append(f"veth {self.host_veth}")
        routes = subprocess.run(["ip", "route", "show"], capture_output=True, text=True, check=False).stdout
        found += [f"route {line}" for line in routes.splitlines() if self.host_veth in line]
        return found

    def run(self, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a short command inside the node's network namespace (nothing else changes)."""
        return _ip(["nsenter", f"--net={self.netns_path}", "--", *argv], check=check)


def _ip(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetworkError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _ranges_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host routes or has an address in (a slot must overlap none)."""
    nets: list[ipaddress.IPv4Network] = []
    for argv in (["ip", "-4", "route", "show", "table", "all"], ["ip", "-4", "-o", "addr", "show"]):
        out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        for word in out.split():
            if "/" in word or word.count(".") == 3:
                with contextlib.suppress(ValueError):
                    net = ipaddress.ip_network(word, strict=False)
                    if isinstance(net, ipaddress.IPv4Network) and net.prefixlen > 0:
                        nets.append(net)
    return nets
