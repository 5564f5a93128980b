"""`servegraph status NAME`: a ServeGraph shown as its graph, node by node, with what
the operator, KubeRay and Ray Serve report about each (`tree.py` draws, `gather.py` reads)."""
