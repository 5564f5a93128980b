"""The Ray clusters and the pods that are not running, and why (pure).

KubeRay's RayCluster status says whether the head pod is ready, how many workers
are, and which pod it could not create (a quota, an admission policy); it does not
say that no node has the CPU or GPU a pod asks for, or that its image cannot be
pulled. The pod says it: `PodScheduled=False` carries the scheduler's reason, a
waiting container the kubelet's (ImagePullBackOff, ErrImageNeverPull,
CrashLoopBackOff with how the last run ended). `servegraph status` reads both with
the caller's own credentials, fresh: the operator has no permission on pods, and
KubeRay's copy of the RayCluster status in the RayService is not kept current.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
GROUP_LABEL = "ray.io/group"
MAX_PODS = 20
MAX_WHY = 300


def cluster_facts(raycluster: Mapping[str, Any] | None) -> tuple[list[str], str]:
    """(how far a RayCluster got, the problem KubeRay names for it or "")."""
    status = (raycluster or {}).get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or () if isinstance(c, Mapping)}
    facts = [f"state {status['state']}"] if status.get("state") else []
    head = conditions.get("HeadPodReady")
    if head is not None:
        facts.append("head pod ready" if head.get("status") == "True" else "head pod not ready")
    desired = status.get("desiredWorkerReplicas")
    if isinstance(desired, int) and desired > 0:  # KubeRay omits counts that are 0
        facts.append(f"{status.get('readyWorkerReplicas') or 0} of {desired} workers ready")
    failure = conditions.get("RayClusterReplicaFailure")
    if failure is not None and failure.get("status") == "True":  # a pod KubeRay could not create
        return facts, _words(failure.get("reason"), failure.get("message"))
    if status.get("reason"):
        return facts, _words(status.get("state"), status["reason"])
    return facts, ""


def not_running(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods not Running (or Succeeded), and Running ones with a container waiting (crash loops), by name."""
    out = []
    for pod in pods:
        status = pod.get("status") or {}
        waiting = any((c.get("state") or {}).get("waiting") for c in _containers(status))
        if status.get("phase") not in ("Running", "Succeeded") or waiting:
            out.append(pod)
    return sorted(out, key=lambda p: str((p.get("metadata") or {}).get("name", "")))


def lines(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """`name (head|worker GROUP)  PHASE  why; why` for each pod not running, at most MAX_PODS."""
    stuck = not_running(pods)
    out = [_line(pod) for pod in stuck[:MAX_PODS]]
    if len(stuck) > MAX_PODS:
        out.append(f"… and {len(stuck) - MAX_PODS} more")
    return out


def _line(pod: Mapping[str, Any]) -> str:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    role = labels.get(NODE_TYPE_LABEL, "")
    if role == "worker" and labels.get(GROUP_LABEL):
        role += f" {labels[GROUP_LABEL]}"
    name = str(meta.get("name", "")) + (f" ({role})" if role else "")
    return f"{name}  {status.get('phase') or 'Unknown'}  {'; '.join(why(status))}".rstrip()


def why(status: Mapping[str, Any]) -> list[str]:
    """What keeps one pod from running, most decisive first."""
    reasons = []
    scheduled = next((c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"), None)
    if scheduled is not None and scheduled.get("status") == "False":
        reasons.append("not scheduled: " + _words(scheduled.get("reason"), scheduled.get("message")))
    for c in _containers(status):
        state = c.get("state") or {}
        waiting, terminated = state.get("waiting"), state.get("terminated")
        if waiting:
            text = f"container {c.get('name')}: " + _words(waiting.get("reason"), waiting.get("message"))
            last = (c.get("lastState") or {}).get("terminated")
            if last:
                text += f" (last run: {last.get('reason') or 'terminated'}, exit code {last.get('exitCode')})"
            reasons.append(text)
        elif terminated and status.get("phase") == "Failed":
            reasons.append(
                f"container {c.get('name')} ended: {terminated.get('reason') or 'terminated'}, "
                f"exit code {terminated.get('exitCode')}"
            )
    if status.get("reason") or status.get("message"):  # e.g. Evicted: the node was low on memory
        reasons.append(_words(status.get("reason"), status.get("message")))
    if not reasons and scheduled is None and status.get("phase") == "Pending":
        reasons.append("no scheduling decision yet")
    return reasons


def _containers(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]


def _words(reason: Any, message: Any) -> str:
    text = ": ".join(str(x) for x in (reason, message) if x) or "no reason given"
    text = " ".join(text.split())
    return text if len(text) <= MAX_WHY else text[: MAX_WHY - 1] + "…"
