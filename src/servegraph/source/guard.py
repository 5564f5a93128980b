"""Where graphs may be downloaded from: one policy, for the URL and for every connection.

A ServeGraph's author chooses the URL, and the operator sends it a request, with a
bearer token, from inside the cluster: without a guard a tenant could make the
operator talk to the cloud's metadata service, the API server or any Service, and
read from the status which ports answer. Two checks, one rule:

- `check_url` reads the URL exactly as the HTTP client will (yarl, which aiohttp
  uses) and returns that parsed URL, so nothing is re-parsed between the check and
  the request. The host must be plain ASCII (internationalized names in punycode):
  IDNA would otherwise turn fullwidth digits and dots into an IP literal after the
  check; a redirect's Location is held to the same rule (`check_redirect`). Numeric
  forms a resolver reads as an address (`0xA9FEA9FE`, `2852039166`) are refused, and
  the host must match the administrator's allowlist. Plain http needs both the
  ServeGraph's and the administrator's word.
- `address_refusal` is applied where each connection is made (`connector()`'s
  socket factory), for IP literals and resolved names alike, on every redirect hop
  and retry: loopback, unspecified, multicast, link-local and cloud metadata
  addresses, the cluster's API server and Service range, the operator's own pod and
  what the administrator denies are refused, also when written as IPv4 embedded in
  IPv6 (addresses.py). IP literals are checked early with the same function, so their
  message is the same as at connect time.

Messages never say which internal address a name resolved to, nor why a connection
failed: `FetchError.detail` carries that for the operator's log.
"""

from __future__ import annotations

import dataclasses
import errno
import fnmatch
import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import yarl

from servegraph.source.addresses import (
    DEFAULT_DENIED,
    LOCAL_NAT64,
    NEVER,
    RFC6052_LENGTHS,
    IPAddress,
    IPNetwork,
    embedded_ipv4,
)

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_NUMBER = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
REFUSED = "address refused by the graph source policy"
"""The text of every connect-time refusal: equal texts keep the error's type when
aiohttp's happy-eyeballs combines the failures of several addresses."""


class SourceRefused(Exception):
    """The URL or one of its addresses may not be contacted; `detail` is for the operator's log.

    `reason`: InvalidURL (unparsable, credentials, bad port), InsecureURL (not https),
    or SourceRefused (the host or its address is not allowed).
    """

    def __init__(self, message: str, detail: str = "", reason: str = "SourceRefused") -> None:
        super().__init__(message)
        self.detail = detail or message
        self.reason = reason


class ForbiddenAddress(OSError):
    """Raised by the socket factory, so the connection is never opened."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(errno.EACCES, REFUSED)
        self.address = address
        self.reason = reason


@dataclass(frozen=True)
class SourcePolicy:
    """What the administrator allows; tenants cannot change any of it.

    `allowed_hosts`: globs a URL's host must match (`*` any; empty: none at all).
    `allowed_networks`: exceptions to the default refusals (never to NEVER, the API server
    or the operator's own pod).
    `denied_networks`: refused too (the cluster's Service range, found at start-up, goes here).
    `denied_endpoints`: (address, port) pairs refused: the API server as the client reaches it
    and its real endpoints (the `kubernetes` Service's EndpointSlice).
    `own_addresses`: the operator's pod, refused on every port (its health, metrics and
    events endpoints answer from there).
    `allow_insecure_http`: whether a ServeGraph's `allowInsecureHTTP` may take effect at all
    (`--allow-insecure-http-sources`); off, plain http is refused whatever the tenant asks.
    """

    allowed_hosts: tuple[str, ...] = ("*",)
    allowed_networks: tuple[IPNetwork, ...] = ()
    denied_networks: tuple[IPNetwork, ...] = ()
    denied_endpoints: frozenset[tuple[IPAddress, int]] = field(default_factory=frozenset)
    own_addresses: frozenset[IPAddress] = field(default_factory=frozenset)
    allow_insecure_http: bool = False

    @classmethod
    def build(
        cls,
        allowed_hosts: Iterable[str] = ("*",),
        allowed_networks: Iterable[str] = (),
        denied_networks: Iterable[str] = (),
        denied_endpoints: Iterable[tuple[str, int]] = (),
        *,
        allow_insecure_http: bool = False,
    ) -> SourcePolicy:
        """From the command line's strings; raises ValueError naming a malformed network."""
        return cls(
            allowed_hosts=tuple(h.strip().lower().rstrip(".") for h in allowed_hosts if h.strip()),
            allowed_networks=tuple(_network(n) for n in allowed_networks if n.strip()),
            denied_networks=tuple(_network(n) for n in denied_networks if n.strip()),
            denied_endpoints=frozenset((ipaddress.ip_address(a), p) for a, p in denied_endpoints),
            allow_insecure_http=allow_insecure_http,
        )

    def with_denied(
        self,
        networks: Iterable[IPNetwork],
        endpoints: Iterable[tuple[IPAddress, int]],
        own: Iterable[IPAddress] = (),
    ) -> SourcePolicy:
        """This policy plus what was learnt about the cluster (its Service range, its API
        server) and about the operator's own pod."""
        return dataclasses.replace(
            self,
            denied_networks=(*self.denied_networks, *networks),
            denied_endpoints=self.denied_endpoints | frozenset(endpoints),
            own_addresses=self.own_addresses | frozenset(own),
        )

    def describe(self) -> str:
        """One log line: what is refused besides the built-in ranges."""
        nets = ", ".join(str(n) for n in self.denied_networks) or "none"
        ends = ", ".join(f"{a}:{p}" for a, p in sorted(self.denied_endpoints, key=str)) or "none"
        own = ", ".join(sorted(str(a) for a in self.own_addresses)) or "none"
        allowed = ", ".join(str(n) for n in self.allowed_networks) or "none"
        hosts = ", ".join(self.allowed_hosts) or "none"
        http = "allowed where a ServeGraph asks" if self.allow_insecure_http else "refused"
        return (
            f"source hosts {hosts}; also denied networks {nets}, endpoints {ends}, own pod {own}; "
            f"allowed exceptions {allowed}; plain http {http}"
        )

    # -- the address rule ------------------------------------------------------------

    def address_refusal(self, address: str, port: int | None = None) -> str | None:
        """Why this address (and port) may not be contacted, or None. The one address rule."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return f"{address!r} is not an IP address"
        for candidate in (ip, *embedded_ipv4(ip, self._nat64_lengths(ip))):
            reason = self._refusal(candidate, port)
            if reason is not None:
                shown = f"{candidate} (in {ip})" if candidate != ip else str(ip)
                return f"{shown} is {reason}"
        return None

    def _nat64_lengths(self, ip: IPAddress) -> tuple[int, ...]:
        """Where a local-use NAT64 address carries its IPv4: after the translator's prefix the
        administrator allowed (its length says where, RFC 6052), else at every position."""
        lengths = {
            net.prefixlen
            for net in self.allowed_networks
            if isinstance(net, ipaddress.IPv6Network)
            and ip in net
            and net.subnet_of(LOCAL_NAT64)
            and net.prefixlen in RFC6052_LENGTHS
        }
        return tuple(sorted(lengths)) or RFC6052_LENGTHS

    def _refusal(self, ip: IPAddress, port: int | None) -> str | None:
        for why, net in NEVER:
            if ip in net:
                return f"{why} ({net})"
        if (ip, port) in self.denied_endpoints:
            return f"the cluster's API server ({ip}:{port})"
        if ip in self.own_addresses:
            return f"the operator's own pod ({ip})"
        if any(ip in net for net in self.allowed_networks):
            return None
        for why, net in DEFAULT_DENIED:
            if ip in net:
                return f"{why} ({net})"
        for net in self.denied_networks:
            if ip in net:
                return f"denied by the administrator or the cluster's Service range ({net})"
        return None

    # -- the URL -----------------------------------------------------------------------

    def check_url(self, url: str | yarl.URL, allow_insecure_http: bool = False, *, written: str = "") -> yarl.URL:
        """The URL as aiohttp will read it, or SourceRefused saying why not.

        `allow_insecure_http` is the ServeGraph's wish; plain http also needs the
        administrator's `allow_insecure_http`. `written`: the text a parsed `url` came
        from (a Location header), so that its host is read as written, not as IDNA mapped it.
        """
        try:
            parsed = url if isinstance(url, yarl.URL) else yarl.URL(url)
            port = parsed.port
        except Exception:  # yarl raises ValueError, and IndexError on some inputs (found by fuzz/fuzz_guard.py)
            raise SourceRefused(
                f"refusing {safe_url(str(url))}: not a valid URL (is the port a number?)", reason="InvalidURL"
            ) from None
        text = written or (url if isinstance(url, str) else str(url))
        where = safe_url(text)  # as written, not as IDNA mapped it
        if parsed.scheme != "https" and not (parsed.scheme == "http" and allow_insecure_http):
            raise SourceRefused(
                f"refusing {where}: only https:// (or http:// with allowInsecureHTTP)", reason="InsecureURL"
            )
        if parsed.scheme == "http" and not self.allow_insecure_http:
            raise SourceRefused(
                f"refusing {where}: this operator does not download over plain http "
                "(its administrator has not allowed it, --allow-insecure-http-sources); use https://"
            )
        if parsed.raw_user is not None or parsed.raw_password is not None:
            raise SourceRefused(
                f"refusing {where}: credentials in the URL; put the token in the Secret", reason="InvalidURL"
            )
        if port is None or not 0 < port < 65536:
            raise SourceRefused(f"refusing {where}: the port must be a number from 1 to 65535", reason="InvalidURL")
        host = _host(parsed, text)
        if host is None:
            raise SourceRefused(
                f"refusing {where}: the host must be a DNS name of ASCII letters, digits and '-' "
                "(internationalized names in punycode, xn--...) or an IP address"
            )
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:  # a literal: the connect-time rule, early, so the message says the real reason
            reason = self.address_refusal(host, port)
            if reason is not None:
                raise SourceRefused(refusal_message(where, host), f"{host}:{port}: {reason}")
        if not any(fnmatch.fnmatchcase(host, pattern) for pattern in self.allowed_hosts):
            allowed = ", ".join(self.allowed_hosts) or "none"
            raise SourceRefused(f"refusing {where}: host {host} is not in the allowed source hosts ({allowed})")
        return parsed

    def check_redirect(self, base: yarl.URL, location: str, allow_insecure_http: bool) -> yarl.URL:
        """A Location header under the spec URL's rule, host as written included (a relative
        one keeps the host already checked). ValueError if yarl cannot read it at all."""
        target = yarl.URL(location)
        joined = base.join(target)
        return self.check_url(joined, allow_insecure_http, written=location if target.absolute else "")

    # -- the connection ------------------------------------------------------------------

    def socket_factory(self, addr_info: Any) -> socket.socket:
        """aiohttp's socket factory: the last step before connect(), for every address tried."""
        family, type_, proto, _, sockaddr = addr_info
        reason = self.address_refusal(str(sockaddr[0]), int(sockaddr[1]))
        if reason is not None:
            raise ForbiddenAddress(str(sockaddr[0]), reason)
        return socket.socket(family=family, type=type_, proto=proto)

    def connector(self, **kwargs: Any) -> aiohttp.TCPConnector:
        """A connector whose every connection passes `address_refusal` (IP literals included)."""
        return aiohttp.TCPConnector(socket_factory=self.socket_factory, **kwargs)


def refusal_message(where: str, host: str) -> str:
    """What a tenant is told: the same for a literal and a name, never the resolved address."""
    return (
        f"refusing {where}: {host} is, or resolves to, an address graphs may not be downloaded from "
        "(loopback, link-local or cloud metadata, the cluster's API server or Service range, "
        "or one the administrator denies)"
    )


def safe_url(url: str) -> str:
    """The URL as written, without userinfo, query or fragment: fit for logs and status."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(an invalid URL)"
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def _host(parsed: yarl.URL, original: str) -> str | None:
    """The host aiohttp connects to, if it is plain ASCII and the original text says the same."""
    raw = (parsed.raw_host or "").lower()
    authority = original.partition("//")[2]
    for end in "/?#\\":
        authority = authority.partition(end)[0]
    if not raw or not authority.isascii() or "%" in raw:
        return None
    if ":" in raw:  # an IPv6 literal; zone ids only make sense for link-local, which is refused
        try:
            return str(ipaddress.IPv6Address(raw))
        except ValueError:
            return None
    name = raw[:-1] if raw.endswith(".") else raw
    try:
        return str(ipaddress.IPv4Address(name))
    except ValueError:
        pass
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return None
    if _NUMBER.fullmatch(labels[-1]):  # read as a number by resolvers: 0xA9FEA9FE, 2852039166, 169.254.43518
        return None
    return name


def _network(text: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a network like 10.0.0.0/8 or fd00::/8") from None


def forbidden_cause(exc: BaseException) -> ForbiddenAddress | str | None:
    """The connect-time refusal behind an aiohttp error, if there is one.

    A ForbiddenAddress when it survived; the refusal text alone when happy-eyeballs
    merged it with other addresses' failures into one OSError.
    """
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 16:
        chain.append(seen)
        seen = getattr(seen, "os_error", None) or seen.__cause__ or seen.__context__
    found = next((e for e in chain if isinstance(e, ForbiddenAddress)), None)
    if found is not None:
        return found
    return REFUSED if any(REFUSED in str(e) for e in chain) else None
