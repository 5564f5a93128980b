"""Which addresses the source policy refuses, and which IPv4 addresses an IPv6 address carries.

Pure data and arithmetic over `ipaddress`, apart from the policy (guard.py) that applies
them: the ranges a download may never reach, those refused unless the administrator
allows them, and every way an IPv6 address routes to an IPv4 one (mapped, compatible,
translated, NAT64 and local-use NAT64, 6to4, Teredo, ISATAP).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Never contacted, whatever the administrator allows: link-local (where most clouds
# serve instance metadata and credentials) and the metadata addresses outside it.
NEVER = (
    ("the EKS Pod Identity Agent", ipaddress.ip_network("169.254.170.23/32")),
    ("the EKS Pod Identity Agent", ipaddress.ip_network("fd00:ec2::23/128")),
    ("link-local", ipaddress.ip_network("169.254.0.0/16")),
    ("link-local", ipaddress.ip_network("fe80::/10")),
    ("cloud metadata (AWS)", ipaddress.ip_network("fd00:ec2::254/128")),
    ("cloud metadata (GCP)", ipaddress.ip_network("fd20:ce::254/128")),
    ("cloud metadata (Alibaba)", ipaddress.ip_network("100.100.100.200/32")),
    ("cloud metadata (Azure WireServer)", ipaddress.ip_network("168.63.129.16/32")),
    ("cloud metadata (Oracle)", ipaddress.ip_network("192.0.0.192/32")),
)
# Refused unless the administrator allows them (`--allowed-source-networks`), e.g. a
# development registry on loopback.
DEFAULT_DENIED = (
    ("this host", ipaddress.ip_network("0.0.0.0/8")),
    ("loopback", ipaddress.ip_network("127.0.0.0/8")),
    ("multicast", ipaddress.ip_network("224.0.0.0/4")),
    ("reserved or broadcast", ipaddress.ip_network("240.0.0.0/4")),
    ("unspecified", ipaddress.ip_network("::/128")),
    ("loopback", ipaddress.ip_network("::1/128")),
    ("multicast", ipaddress.ip_network("ff00::/8")),
    ("IPv4-translated", ipaddress.ip_network("::ffff:0:0:0/96")),
    ("local-use NAT64 (allow your translator's prefix to use it)", ipaddress.ip_network("64:ff9b:1::/48")),
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
# RFC 6052's prefix lengths a translator may use; each puts the IPv4 address elsewhere.
RFC6052_LENGTHS = (48, 56, 64, 96)
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # RFC 2765 SIIT (mapped is ::ffff:0:0/96)
_COMPATIBLE = ipaddress.ip_network("::/96")


def embedded_ipv4(ip: IPAddress, nat64_lengths: Iterable[int] = RFC6052_LENGTHS) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (and routes to, through a translator or tunnel).

    A local-use NAT64 address (64:ff9b:1::/48, RFC 8215) carries its IPv4 where the
    translator's prefix length puts it (RFC 6052), which only the network knows: all of
    `nat64_lengths`' positions are returned.
    """
    if isinstance(ip, ipaddress.IPv4Address):
        return []
    found = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _COMPATIBLE and int(ip) > 1:
        found.append(low32)
    if ip in _TRANSLATED or ip in _NAT64:
        found.append(low32)
    if ip in LOCAL_NAT64:
        found.extend(rfc6052_ipv4(ip, length) for length in nat64_lengths)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if (int(ip) >> 32) & 0xFDFFFFFF == 0x00005EFE:  # ISATAP interface identifier
        found.append(low32)
    return found


def rfc6052_ipv4(ip: ipaddress.IPv6Address, prefix_length: int) -> ipaddress.IPv4Address:
    """The IPv4 address a translator with a prefix of this length reads: the four bytes after
    the prefix, skipping bits 64-71 (RFC 6052, section 2.2)."""
    octets = [b for i, b in enumerate(ip.packed) if i >= prefix_length // 8 and i != 8]
    return ipaddress.IPv4Address(bytes(octets[:4]))
