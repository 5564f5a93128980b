"""A canary's evidence: what each version of a graph did, read from Prometheus or from the
routers' own counters. The only code that reads serving metrics; decides nothing
(operator/rollout/analysis.py judges)."""

from servegraph.evidence.counts import Counts, Evidence, EvidenceError, NodeCounts, Reader, Request

__all__ = ["Counts", "Evidence", "EvidenceError", "NodeCounts", "Reader", "Request"]
