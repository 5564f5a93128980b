"""The node tier: a real one-node cluster (controllers, kubelet, containerd, CNI, DNS)."""

from servegraph_testbed.node.cluster import NodeCluster
from servegraph_testbed.node.network import NodeNetwork

__all__ = ["NodeCluster", "NodeNetwork"]
