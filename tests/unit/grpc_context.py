"""What Ray Serve hands a gRPC method that names `grpc_context`: the call's metadata, and setters
for the status its proxy sends (the parts of `ray.serve.grpc_util.RayServegRPCContext` we use)."""

from __future__ import annotations

from typing import Any


class GrpcContext:
    def __init__(self, metadata: dict[str, Any] | None = None) -> None:
        self.metadata = [("application", "app"), *(metadata or {}).items()]
        self.code: Any = None
        self.details = ""

    def invocation_metadata(self) -> list[tuple[str, Any]]:
        return list(self.metadata)

    def set_code(self, code: Any) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details
