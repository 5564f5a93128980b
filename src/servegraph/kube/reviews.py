"""Ask the API server who presented a bearer token and whether they may read a path:
TokenReview, then SubjectAccessReview (the delegated authentication and authorization
every Kubernetes component's metrics endpoint uses).

Reviews are not writes: every replica serves /metrics, leader or not, so there is no
fence here. The token goes only into the TokenReview's body; no error carries it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes_asyncio import client

from servegraph.kube.client import API_TIMEOUT_S, KubeError, _raw


@dataclass(frozen=True)
class Verdict:
    """`allowed` with the user it was decided for (empty when the token was not valid)."""

    allowed: bool
    user: str
    reason: str


class Reviews:
    """TokenReview + SubjectAccessReview on kubernetes_asyncio (raw JSON, with timeouts)."""

    def __init__(self, api: client.ApiClient, timeout_s: float = API_TIMEOUT_S) -> None:
        self._authn = client.AuthenticationV1Api(api)
        self._authz = client.AuthorizationV1Api(api)
        self.timeout_s = timeout_s

    async def may_get(self, token: str, path: str) -> Verdict:
        """Authenticate `token`, then ask whether its user may `get` the non-resource `path`."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        done = await _raw(
            self._authn.create_token_review(review, _preload_content=False, _request_timeout=self.timeout_s),
            "TokenReview",
        )
        status = (done or {}).get("status") or {}
        if not status.get("authenticated"):
            return Verdict(False, "", "token not valid")
        user = status.get("user") or {}
        spec = {
            "user": user.get("username", ""),
            "uid": user.get("uid", ""),
            "groups": user.get("groups") or [],
            "extra": user.get("extra") or {},
            "nonResourceAttributes": {"path": path, "verb": "get"},
        }
        access = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        decided = await _raw(
            self._authz.create_subject_access_review(access, _preload_content=False, _request_timeout=self.timeout_s),
            "SubjectAccessReview",
        )
        result = (decided or {}).get("status") or {}
        name = str(spec["user"])
        if result.get("allowed"):
            return Verdict(True, name, "allowed")
        return Verdict(False, name, str(result.get("reason") or "no RBAC rule allows it"))


__all__ = ["KubeError", "Reviews", "Verdict"]
