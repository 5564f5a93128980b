"""Fuzz the source policy: the URL and host guard every download passes (servegraph.source.guard).

    .venv/bin/python fuzz/fuzz_guard.py [libFuzzer flags] [corpus dirs]

Each input is a URL (UTF-8, bytes that are not are replaced). The oracle (`check`) is
what the operator relies on to never contact an address it refuses:

- `check_url` raises SourceRefused or returns the URL as aiohttp will read it; nothing else;
- an accepted URL's host is plain ASCII: LDH labels (not numeric: no resolver may read it
  as an address, `inet_aton` included) or an IP literal, and matches the allowlist;
- an accepted IP literal passes `address_refusal` for its port, the rule applied where the
  connection is made (the two checks cannot disagree);
- an IPv6 address carrying a refused IPv4 address (mapped, compatible, translated, NAT64
  and local-use NAT64, 6to4, Teredo, ISATAP) is refused too, for addresses drawn from the input's bytes.

Most mutations are structure-aware: a seed URL's host rewritten with Unicode digits and
dots, percent-encoding, numeric and IPv6 forms of refused addresses, userinfo, ports,
trailing dots and stray delimiters; the rest are libFuzzer's byte mutations.
`tests/unit/test_fuzz_guard.py` runs the same oracle and mutator without atheris.
"""

from __future__ import annotations

import contextlib
import ipaddress
import random
import shlex
import socket
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    import atheris

    _instrumented: Any = atheris.instrument_imports(include=["servegraph.source", "yarl", "idna"])
else:
    _instrumented = contextlib.nullcontext()

with _instrumented:
    import fnmatch

    import yarl

    from servegraph.source.guard import SourcePolicy, SourceRefused

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus" / "guard"
MAX_SIZE = 512
POLICIES = (
    SourcePolicy(),
    SourcePolicy.build(
        allowed_hosts=["*.example.com", "registry.internal", "10.*"],
        allowed_networks=["127.0.0.0/8"],
        denied_networks=["10.96.0.0/12", "fd00:96::/64"],
        denied_endpoints=[("192.0.2.10", 6443)],
    ),
)
REFUSED_V4 = [
    "169.254.169.254", "127.0.0.1", "0.0.0.0", "100.100.100.200", "168.63.129.16", "10.96.0.1", "224.0.0.1",
]  # fmt: skip


def check(data: bytes) -> bool:
    """Raise on a bug; return whether some policy accepted the URL."""
    url = data.decode("utf-8", "replace")
    accepted = False
    for policy in POLICIES:
        try:
            parsed = policy.check_url(url, allow_insecure_http=True)
        except SourceRefused as exc:
            _expect(bool(str(exc)) and exc.reason in {"InvalidURL", "InsecureURL", "SourceRefused"}, "bad refusal")
            continue
        accepted = True
        _accepted(policy, parsed)
    _embedded(data)
    return accepted


def _accepted(policy: SourcePolicy, parsed: yarl.URL) -> None:
    host = (parsed.raw_host or "").lower()
    _expect(bool(host) and host.isascii(), f"accepted a non-ASCII or empty host {host!r}")
    name = host[:-1] if host.endswith(".") else host
    try:
        literal = ipaddress.ip_address(name)
    except ValueError:
        literal = None
    port = parsed.port
    _expect(port is not None and 0 < port < 65536, f"accepted port {port}")
    if literal is not None:
        reason = policy.address_refusal(str(literal), port)
        _expect(reason is None, f"accepted the literal {literal}, which the connection would refuse: {reason}")
    else:
        _expect(all(c.isalnum() or c in "-." for c in name), f"accepted host {name!r} with other characters")
        numeric = True
        try:
            socket.inet_aton(name)
        except OSError:
            numeric = False
        _expect(not numeric, f"accepted {name!r}, which a resolver reads as an IPv4 address")
    _expect(any(fnmatch.fnmatchcase(name, p) for p in policy.allowed_hosts), f"{name!r} is not in the allowlist")


def _embedded(data: bytes) -> None:
    """IPv6 forms carrying a refused IPv4 address are refused; which one comes from the input."""
    pick = data[0] if data else 0
    v4 = ipaddress.IPv4Address(REFUSED_V4[pick % len(REFUSED_V4)])
    noise = int.from_bytes((data[1:9] or b"\x00").ljust(8, b"\x00"), "big")
    forms = [
        f"::ffff:{v4}",
        f"::{v4}",
        f"64:ff9b::{v4}",
        f"::ffff:0:{v4}",  # IPv4-translated (SIIT)
        str(
            ipaddress.IPv6Address(  # local-use NAT64 with a /48 prefix (RFC 6052's split around bits 64-71)
                (0x0064FF9B0001 << 80) | ((int(v4) >> 16) << 64) | ((int(v4) & 0xFFFF) << 40) | (noise & 0xFFFFFFFFFF)
            )
        ),
        str(ipaddress.IPv6Address((0x2002 << 112) | (int(v4) << 80) | (noise & ((1 << 80) - 1)))),
        str(ipaddress.IPv6Address((0x20010000 << 96) | ((noise & 0xFFFFFFFF) << 64) | (int(v4) ^ 0xFFFFFFFF))),
        str(ipaddress.IPv6Address(((noise & 0xFFFFFFFFFFFFFFFF) << 64) | (0x00005EFE << 32) | int(v4))),
    ]
    for policy in POLICIES:
        if policy.address_refusal(str(v4), 6443) is None:
            continue
        for form in forms:
            _expect(policy.address_refusal(form, 6443) is not None, f"{form} carries {v4} but is not refused")


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


# --- mutation -----------------------------------------------------------------

_DIGITS = [0xFF10, 0x0660, 0x06F0, 0x0966, 0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6, 0x2080, 0x2070]
_DOTS = [".", "\uff0e", "\u3002", "\uff61", "\u2024", "%2e", "%2E", "\u0589"]
_HOSTS = [
    "169.254.169.254", "127.0.0.1", "localhost", "0.0.0.0", "0", "0x7f000001", "2130706433", "0177.0.0.1",
    "127.1", "[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[64:ff9b::a9fe:a9fe]", "[2002:a9fe:a9fe::]",
    "[fe80::1%25eth0]", "[::]", "registry.example.com", "a.example.com", "xn--bcher-kva.example.com",
    "10.96.0.1", "10.1.2.3", "192.0.2.10", "100.100.100.200", "registry.internal", "metadata.google.internal",
    "REGISTRY.EXAMPLE.COM.", "ex%61mple.com", "a..b", "-a.com", "a-.com", "_a.com", "a_b.example.com",
]  # fmt: skip
_PARTS = ["", "user@", "user:pw@", "a@b@", "%40@", "@"]
_PORTS = ["", ":443", ":6443", ":0", ":65535", ":65536", ":-1", ":80a", ":", ":00080", ":99999999999"]
_PATHS = ["/", "/v1/graphs/g", "", "?x=1", "#f", "/a\\b", "\\\\evil.com/", "/..;/", "/%2e%2e/"]
_DELIMITERS = ["@", ":", "/", "\\", "?", "#", "[", "]", "%", "\t", "\n", "\x00", " ", "."]
_SCHEMES = ["https://", "http://", "HTTPS://", "https:/", "https:", "https:\\\\", "ftp://", "", "//"]


def mutate(data: bytes, max_size: int, rng: random.Random, byte_mutate: Callable[[bytes, int], bytes]) -> bytes:
    if rng.random() < 0.7:
        url = data.decode("utf-8", "replace") if data and rng.random() < 0.3 else _build(rng)
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            url = _edit(url, rng)
        out = url.encode("utf-8", "surrogatepass")
        if len(out) <= max_size:
            return out
    return byte_mutate(data, max_size)


def _build(rng: random.Random) -> str:
    return rng.choice(_SCHEMES) + rng.choice(_PARTS) + rng.choice(_HOSTS) + rng.choice(_PORTS) + rng.choice(_PATHS)


def _edit(url: str, rng: random.Random) -> str:
    choice = rng.randrange(7)
    if choice == 0:  # digits to another script
        base = rng.choice(_DIGITS)
        return "".join(chr(base + int(c)) if c in "0123456789" and rng.random() < 0.7 else c for c in url)
    if choice == 1:  # dots to lookalikes
        dot = rng.choice(_DOTS)
        return "".join(dot if c == "." and rng.random() < 0.7 else c for c in url)
    if choice == 2 and url:  # percent-encode one character
        i = rng.randrange(len(url))
        return url[:i] + "".join(f"%{b:02X}" for b in url[i].encode("utf-8", "replace")) + url[i + 1 :]
    if choice == 3 and url:  # insert a delimiter or a control character
        i = rng.randrange(len(url) + 1)
        return url[:i] + rng.choice(_DELIMITERS) + url[i:]
    if choice == 4:  # case
        return url.upper() if rng.random() < 0.5 else url.swapcase()
    if choice == 5:  # splice two
        return url + rng.choice(_HOSTS) if rng.random() < 0.5 else rng.choice(_HOSTS) + url
    return _build(rng)


def byte_mutate(data: bytes, max_size: int, rng: random.Random) -> bytes:
    out = bytearray(data or b"https://x/")
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(3)
        i = rng.randrange(len(out) + 1)
        if op == 0 and out:
            del out[min(i, len(out) - 1)]
        elif op == 1:
            out[i:i] = bytes([rng.randrange(256)])
        elif out:
            out[min(i, len(out) - 1)] = rng.randrange(256)
    return bytes(out[:max_size])


@dataclass
class Stats:
    executions: int = 0
    accepted: int = 0
    seconds: float = 0.0


class Crash(Exception):
    def __init__(self, data: bytes, cause: str) -> None:
        self.data = data
        super().__init__(f"{cause} on input {data!r}")


def corpus() -> list[bytes]:
    return [p.read_bytes() for p in sorted(CORPUS.iterdir()) if p.is_file()]


def fuzz_loop(seeds: Iterable[bytes], *, iterations: int, seconds: float, seed: int) -> Stats:
    rng = random.Random(seed)
    pool = list(seeds)
    stats = Stats()
    start = time.monotonic()
    while stats.executions < iterations and time.monotonic() - start < seconds:
        data = mutate(rng.choice(pool), MAX_SIZE, rng, lambda d, n: byte_mutate(d, n, rng))
        try:
            accepted = check(data)
        except Exception as exc:
            raise Crash(data, f"{type(exc).__name__}: {exc}") from exc
        stats.executions += 1
        stats.accepted += accepted
        if accepted and len(pool) < 300:
            pool.append(data)
    stats.seconds = time.monotonic() - start
    return stats


def main(argv: list[str]) -> None:
    def one_input(data: bytes) -> None:
        check(data)

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        return mutate(data, max_size, random.Random(seed), atheris.Mutate)

    command = shlex.join([sys.executable, argv[0]])
    atheris.Setup([command, *argv[1:]], one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
