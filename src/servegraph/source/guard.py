"""Which hosts the operator may download graphs from.

A ServeGraph author chooses the URL, and the operator sends it a request from
inside the cluster: without a guard, a ServeGraph could make the operator talk
to the cloud's metadata service. The allowlist is checked on every hop of a
redirect, and the addresses are checked where the connection is made (in the
resolver), so a DNS name that resolves to a forbidden address is refused too.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import socket
from collections.abc import Sequence
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

# Link-local (where cloud metadata services live) and the AWS IPv6 metadata address.
FORBIDDEN_NETWORKS = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("fd00:ec2::254/128"),
)


class ForbiddenAddress(OSError):
    """Raised inside the connector so aiohttp never opens the connection."""


def forbidden_address(address: str) -> str | None:
    """The reason an address may not be contacted, or None."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for net in FORBIDDEN_NETWORKS:
        if ip in net:
            return f"{ip} is in {net} (link-local or cloud metadata)"
    return None


class HostGuard:
    """An allowlist of host globs (`*.example.com`); `*` allows any host not forbidden."""

    def __init__(self, allowed: Sequence[str] = ("*",)) -> None:
        self.allowed = tuple(p.strip().lower() for p in allowed if p.strip()) or ("*",)

    def refusal(self, host: str) -> str | None:
        host = host.lower().rstrip(".")
        forbidden = forbidden_address(host)
        if forbidden is not None:
            return forbidden
        if not any(fnmatch.fnmatchcase(host, pattern) for pattern in self.allowed):
            return f"host {host} is not in the allowed source hosts ({', '.join(self.allowed)})"
        return None


class GuardedResolver(AbstractResolver):
    """Resolves like aiohttp's default resolver, then refuses forbidden addresses."""

    def __init__(self, inner: AbstractResolver | None = None) -> None:
        self._inner = inner or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            reason = forbidden_address(result["host"])
            if reason:
                raise ForbiddenAddress(f"{host} resolves to {reason}")
        return results

    async def close(self) -> None:
        await self._inner.close()


def guarded_connector(**kwargs: Any) -> Any:
    """An aiohttp TCPConnector whose every connection passes the address check."""
    import aiohttp

    return aiohttp.TCPConnector(resolver=GuardedResolver(), **kwargs)
