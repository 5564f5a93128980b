"""The TLS contexts downloads verify registries with: a tenant's CA bundle, bounded and built once.

A CA bundle is tenant input (a Secret or ConfigMap of the ServeGraph's namespace), and
OpenSSL parses it inside one C call that holds the GIL: measured, a 1 MiB bundle of 960
certificates held the event loop 140 ms, and in an executor thread just as long, since
the loop thread cannot run Python while that call holds the GIL. So a bundle is capped
in size and certificates before anything parses it, then built one certificate per call
on the loop, yielding whenever a slice of `SLICE_S` is spent: no call the loop waits on
is longer than one certificate. Each bundle's outcome is kept by its digest, a failure
as much as a context: a bad bundle is parsed once, not on every download a refresh
annotation or a poll asks for.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import OrderedDict
from typing import TypeVar

KiB = 1024
MAX_BUNDLE_BYTES = 512 * KiB
"""Over twice the whole public web PKI (Debian's ca-certificates.crt: 215 KiB, 144 certificates)."""
MAX_BUNDLE_CERTS = 300
SLICE_S = 0.002
"""The longest the loop runs certificates without letting anything else run."""
KEPT_CONTEXTS = 64
"""Contexts kept by digest: aiohttp pools connections per context, so one per bundle."""
KEPT_FAILURES = 1024
"""Failed digests kept (a few bytes each): a tenant rotating bad bundles only costs a parse each."""

_V = TypeVar("_V")
_BEGIN = "-----BEGIN "
_CERTIFICATE_LABELS = frozenset({"CERTIFICATE", "X509 CERTIFICATE", "TRUSTED CERTIFICATE"})
"""The labels OpenSSL reads as a certificate; blocks of other kinds it skips."""


class InvalidBundle(Exception):
    """The bundle cannot verify anything; the message is the tenant's, `detail` the administrator's."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message


def certificates(pem: str) -> list[str]:
    """The bundle's certificate blocks, after the caps; what OpenSSL would read, split.

    Text between blocks is ignored, as OpenSSL ignores it (the comments of a system
    bundle), and so are blocks of other kinds; a block without its end is refused here,
    before any parse. Plain `str.find`s: a regular expression took 4 ms on 512 KiB.
    """
    _check_size(pem)
    count = pem.count(_BEGIN)
    if count > MAX_BUNDLE_CERTS:
        raise InvalidBundle(
            f"the CA bundle holds {count} PEM blocks, over the limit of {MAX_BUNDLE_CERTS} certificates"
        )
    blocks: list[str] = []
    at = 0
    while (start := pem.find(_BEGIN, at)) >= 0:
        label_end = pem.find("-----", start + len(_BEGIN))
        label = pem[start + len(_BEGIN) : label_end] if label_end >= 0 else ""
        end_marker = f"-----END {label}-----"
        end = pem.find(end_marker, start) if label_end >= 0 else -1
        if end < 0:
            raise InvalidBundle(
                "the CA bundle is not valid PEM certificates", f"PEM block {len(blocks) + 1} has no end"
            )
        at = end + len(end_marker)
        if label in _CERTIFICATE_LABELS:
            blocks.append(pem[start:at])
    if not blocks:
        raise InvalidBundle("the CA bundle is not valid PEM certificates", "no certificate in it")
    return blocks


def _check_size(pem: str) -> None:
    if len(pem) > MAX_BUNDLE_BYTES:
        raise InvalidBundle(f"the CA bundle is over the limit of {MAX_BUNDLE_BYTES} bytes")


class TrustStore:
    """TLS contexts by bundle digest, built off any long call of the loop; one per registry client.

    `builds` counts the bundles parsed (a test and the bench read it): a digest seen
    before, good or bad, is never parsed again while it is kept.
    """

    def __init__(self, slice_s: float = SLICE_S) -> None:
        self.slice_s = slice_s
        self.builds = 0
        self._default: ssl.SSLContext | None = None
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self._failures: OrderedDict[str, InvalidBundle] = OrderedDict()
        self._building: dict[str, asyncio.Future[ssl.SSLContext]] = {}

    async def context(self, pem: str | None) -> ssl.SSLContext:
        """Verified TLS: the system CAs without a bundle, else only the bundle's. Raises InvalidBundle."""
        if not pem:
            if self._default is None:
                self._default = ssl.create_default_context()  # the system's, read once per process
            return self._default
        _check_size(pem)  # before hashing what may be a ConfigMap's whole megabyte
        digest = hashlib.sha256(pem.encode("utf-8", "surrogatepass")).hexdigest()
        kept = self._contexts.get(digest)
        if kept is not None:
            self._contexts.move_to_end(digest)
            return kept
        failed = self._failures.get(digest)
        if failed is not None:
            raise InvalidBundle(str(failed), failed.detail)
        building = self._building.get(digest)
        if building is None:
            building = asyncio.ensure_future(self._build(digest, pem))
            self._building[digest] = building
            building.add_done_callback(lambda done: self._built(digest, done))
        return await asyncio.shield(building)

    def _built(self, digest: str, done: asyncio.Future[ssl.SSLContext]) -> None:
        del self._building[digest]
        if not done.cancelled():
            done.exception()  # retrieved: every caller may have given up waiting (their deadline)

    async def _build(self, digest: str, pem: str) -> ssl.SSLContext:
        self.builds += 1
        try:
            context = await self._load(certificates(pem))
        except InvalidBundle as exc:
            _keep(self._failures, digest, exc, KEPT_FAILURES)
            raise
        _keep(self._contexts, digest, context, KEPT_CONTEXTS)
        return context

    async def _load(self, blocks: list[str]) -> ssl.SSLContext:
        """What `ssl.create_default_context(cadata=bundle)` builds, one certificate per call."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        context: ssl.SSLContext | None = None
        for number, block in enumerate(blocks, 1):
            try:
                if context is None:
                    context = ssl.create_default_context(cadata=block)
                else:
                    context.load_verify_locations(cadata=block)
            except (ssl.SSLError, ValueError) as exc:
                raise InvalidBundle(
                    "the CA bundle is not valid PEM certificates",
                    f"certificate {number}: {getattr(exc, 'reason', None) or type(exc).__name__}",
                ) from None
            if loop.time() - started >= self.slice_s:
                await asyncio.sleep(0)
                started = loop.time()
        assert context is not None  # `certificates` returns at least one block
        return context


def _keep(kept: OrderedDict[str, _V], digest: str, value: _V, limit: int) -> None:
    kept[digest] = value
    kept.move_to_end(digest)
    while len(kept) > limit:
        kept.popitem(last=False)
