"""The third hostile-tenant round (issue 45): what a tenant's input costs, before and after.

    python bench/hostile_bench.py [--parts ca,payload,stream,metrics]

- ca: a tenant's CA bundle against the real HTTPS registry (testbed): the event loop's
  longest stall on the first download and on later ones, and how often the bundle was
  read, for the issue's 1 MiB bundle of 960 certificates with a broken last one and for
  the largest bundle allowed now (broken, and good). "Before" is what every download did
  until now: one `ssl.create_default_context(cadata=bundle)` on the loop, never kept
  when it raised.

- payload: the issue's gRPC request (4 MiB, a million empty objects) and a payload at the
  value limit (100,000 numbers), converted as before (`json_format.MessageToDict`, whole
  numbers to ints) and now (`grpcwire.unpack` with the ingress's limits): time and the
  memory the conversion allocates at its peak (tracemalloc).
- stream: GraphService `Call` on an endless stream (a generator yielding small items as
  fast as it can, in process): before, the items gathered for 3 s; now, until a limit.
- metrics: `servegraph run --metrics-auth=kubernetes` on the real control plane (the code
  on PYTHONPATH: run it once on main for "before"): how long a Prometheus scrape whose
  verdict is not kept yet waits while 2,000 junk tokens arrive at once from another address.

Prints Markdown for BENCHMARKS.md ("Issue 45").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import platform
import ssl
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

from servegraph.source import FetchError, FetchRequest, RegistryClient, SourcePolicy  # noqa: E402
from servegraph_testbed.certs import write_pki  # noqa: E402
from servegraph_testbed.loopstall import LoopStall  # noqa: E402
from servegraph_testbed.registry import Registry, RegistryServer  # noqa: E402

TOKEN = "bench-token"
MiB = 1024 * 1024
LOOPBACK = SourcePolicy.build(allowed_networks=["127.0.0.0/8"])
BROKEN = "-----BEGIN CERTIFICATE-----\nTUlJQnJva2Vu\n-----END CERTIFICATE-----\n"


async def longest_stall(work: Callable[[], Awaitable[Any]]) -> float:
    """The loop's longest stall (`LoopStall`, a 1 ms ticker) while `work` runs, in ms."""
    async with LoopStall(settle_s=0.02) as stall:
        with contextlib.suppress(FetchError, ssl.SSLError):
            await work()
    return stall.worst_ms


# -- ca ---------------------------------------------------------------------------------------


def nobodys_cas(count: int, pad: int) -> list[str]:
    """`count` self-signed CA certificates of no one, each padded by an `pad`-byte organisation name."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    pems = []
    for i in range(count):
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, f"nobody {i}"),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "o" * min(pad, 64)),
                *[x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "u" * 64) for _ in range(pad // 64)],
            ]
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(i + 1)
            .not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        pems.append(cert.public_bytes(serialization.Encoding.PEM).decode())
    return pems


async def bench_ca(rounds: int) -> list[tuple[str, int, float, float, float, float]]:
    """Per bundle, medians over `rounds` fresh clients: (what, bytes, before, first, later, reads)."""
    from servegraph.source.trust import MAX_BUNDLE_CERTS

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        pki = write_pki(Path(tmp))
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(pki.serving_cert, pki.serving_key)
        ours = pki.ca_cert.read_text()
        registry = await RegistryServer(Registry(token=TOKEN), server_ssl).start()
        registry.registry.publish("g", b"\x0a\x04mini")
        issue = nobodys_cas(959, pad=128)  # 1,074 bytes each: 1 MiB in all
        allowed = issue[: MAX_BUNDLE_CERTS - 1]
        bundles = {
            "the registry's CA alone (the floor: TLS and HTTP)": ours,
            "960 certificates, the last broken (the issue's)": "".join([*issue, BROKEN]),
            f"{MAX_BUNDLE_CERTS} certificates (the limit), the last broken": "".join([*allowed, BROKEN]),
            f"{MAX_BUNDLE_CERTS} certificates (the limit), the registry's CA last": "".join([*allowed, ours]),
        }
        for what, bundle in bundles.items():

            async def before(bundle: str = bundle) -> None:
                ssl.create_default_context(cadata=bundle)

            was, firsts, laters, reads = [], [], [], []
            for _ in range(rounds):
                was.append(await longest_stall(before))
                async with RegistryClient(LOOPBACK) as client:
                    request = FetchRequest(registry.url("g"), TOKEN, ca_pem=bundle, attempts=1)
                    firsts.append(await longest_stall(lambda request=request: client.fetch(request)))
                    laters.append(max([await longest_stall(lambda r=request: client.fetch(r)) for _ in range(5)]))
                    try:
                        await client.fetch(request)
                        outcome = "downloaded"
                    except FetchError as exc:
                        outcome = f"{exc.reason}: {exc}"
                    reads.append(client.trust.builds)
            row = (what, len(bundle), *(statistics.median(v) for v in (was, firsts, laters, reads)))
            rows.append(row)  # type: ignore[arg-type]
            print(
                f"  ca: {what}: before {row[2]:.0f} ms, now {row[3]:.1f} / {row[4]:.1f} ms; {outcome}", file=sys.stderr
            )
        await registry.stop()
    return rows


# -- payload ----------------------------------------------------------------------------------


def _before(value: Any) -> Any:
    """How grpcwire converted a payload until issue 45."""
    from google.protobuf import json_format

    def whole(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
            return int(v)
        if isinstance(v, list):
            return [whole(x) for x in v]
        if isinstance(v, dict):
            return {k: whole(x) for k, x in v.items()}
        return v

    return whole(json_format.MessageToDict(value))


def _measured(work: Callable[[], Any]) -> tuple[float, float, str]:
    """(seconds, MiB allocated at the peak, outcome) of one call: timed once as it runs, then
    run again under tracemalloc (which slows it several times) for its memory."""
    outcome = "converted"
    start = time.perf_counter()
    try:
        work()
    except ValueError as exc:
        outcome = f"refused: {exc}"
    took = time.perf_counter() - start
    tracemalloc.start()
    with contextlib.suppress(ValueError):
        work()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return took, peak / MiB, outcome


def bench_payload() -> list[tuple[str, str, float, float, str]]:
    from servegraph.runtime import grpcwire
    from servegraph.runtime.payload import Limits
    from servegraph.v1 import service_pb2

    empty = service_pb2.CallRequest()
    for _ in range(1_000_000):
        empty.payload.list_value.values.add().struct_value.SetInParent()
    numbers = service_pb2.CallRequest(payload=grpcwire.to_value(list(range(99_999))))
    rows = []
    for what, request in (
        (f"a million empty objects ({empty.ByteSize() / MiB:.1f} MiB, the issue's)", empty),
        (f"100,000 numbers ({numbers.ByteSize() / MiB:.1f} MiB, at the value limit)", numbers),
    ):
        parsed = service_pb2.CallRequest.FromString(request.SerializeToString())
        for how, work in (
            ("before: json_format.MessageToDict", lambda p=parsed: _before(p.payload)),
            ("now: grpcwire.unpack, Limits()", lambda p=parsed: grpcwire.unpack(p, Limits())),
        ):
            took, peak, outcome = _measured(work)
            rows.append((what, how, took, peak, outcome))
            print(f"  payload: {what}, {how}: {took * 1000:.0f} ms, {peak:.0f} MiB, {outcome}", file=sys.stderr)
    return rows


# -- stream -------------------------------------------------------------------------------------


async def bench_stream() -> list[tuple[str, int, float, str]]:
    from collections.abc import AsyncGenerator

    from servegraph.runtime.calls import Child
    from servegraph.runtime.routers import SequenceRouter
    from servegraph.v1 import service_pb2

    class Endless:
        async def __call__(self, payload: Any) -> AsyncGenerator[dict[str, Any], None]:
            i = 0
            while True:
                yield {"token": "word", "index": i}
                i += 1
                if i % 64 == 0:
                    await asyncio.sleep(0)  # a generator that lets its replica breathe

    class Handle:
        def options(self, **_: Any) -> Handle:
            return self

        def remote(self, payload: Any) -> Any:
            gen = Endless()(payload)

            class Stream:
                closing: asyncio.Future[None] | None = None

                async def __anext__(self) -> Any:
                    return await gen.__anext__()

                def cancel(self) -> None:
                    self.closing = asyncio.ensure_future(gen.aclose())

            return Stream()

    router = SequenceRouter("front", [Child("gen", Handle(), False, streams=True)], streams=True)

    async def before() -> tuple[int, str]:
        held: list[Any] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(3):
                async for item in router.stream("p", {}):
                    held.append(item)
        return len(held), "still going"

    async def now() -> tuple[int, str]:
        reply = await router.Call(service_pb2.CallRequest(payload={"string_value": "p"}))
        return 100_000, reply.error.message

    rows = []
    for what, work in (("before: every item gathered (stopped here after 3 s)", before), ("now: Call", now)):
        start = time.perf_counter()
        items, ended = await work()
        rows.append((what, items, time.perf_counter() - start, ended))
    for row in rows:
        print(f"  stream: {row[0]}: {row[1]} items, {row[2]:.2f} s; {row[3]}", file=sys.stderr)
    return rows


# -- metrics --------------------------------------------------------------------------------------


async def bench_metrics(rounds: int) -> list[float]:
    """Prometheus's scrape (a fresh token each round, so no verdict is kept) during a flood."""
    import aiohttp
    import yaml

    from servegraph_testbed import ControlPlane, find_binaries
    from servegraph_testbed.processes import free_port, http_probe

    waits: list[float] = []
    rbac = ROOT / "config" / "rbac"
    with ControlPlane(find_binaries(), crds=[ROOT / "config" / "crd"]) as cp:
        cp.install_crds(find_binaries().kuberay_crds)
        cp.kubectl("apply", "-f", str(rbac / "role.yaml"))
        cp.kubectl("create", "clusterrolebinding", "bench", "--clusterrole=servegraph-operator",
                   "--user=servegraph-operator")  # fmt: skip
        docs = [d for d in yaml.safe_load_all((rbac / "metrics_auth.yaml").read_text()) if d]
        for d in docs:
            if d["kind"] == "ClusterRoleBinding":
                d["metadata"] = {"name": "bench-auth-delegator"}
                d["subjects"] = [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "servegraph-operator"}
                ]
        cp.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
        reader = next(d for d in docs if d["kind"] == "ClusterRole")["metadata"]["name"]
        port = free_port()
        argv = [sys.executable, "-m", "servegraph.cli", "run", "--health-address", f"127.0.0.1:{port}",
                "--metrics-auth=kubernetes", "--namespace=bench"]  # fmt: skip
        cp.kubectl("create", "namespace", "bench")
        op = cp.spawn("servegraph-operator", argv, identity="servegraph-operator")
        op.wait_ready(lambda: http_probe(f"http://127.0.0.1:{port}/readyz"), timeout=60)
        url = f"http://127.0.0.1:{port}/metrics"
        for r in range(rounds):
            cp.kubectl("create", "serviceaccount", f"prom{r}", "-n", "bench")
            cp.kubectl("create", "clusterrolebinding", f"prom{r}", f"--clusterrole={reader}",
                       f"--serviceaccount=bench:prom{r}")  # fmt: skip
            token = cp.service_account_token("bench", f"prom{r}")
            answered = asyncio.Event()
            async with aiohttp.ClientSession() as prom:
                flood = asyncio.ensure_future(_flood(url, f"127.0.0.{2 + r}", answered))
                await answered.wait()
                start = time.monotonic()
                async with prom.get(url, headers={"Authorization": f"Bearer {token}"}) as resp:
                    assert resp.status == 200, await resp.text()
                waits.append(time.monotonic() - start)
                await flood
            print(f"  metrics: round {r}: Prometheus waited {waits[-1] * 1000:.0f} ms", file=sys.stderr)
        cp.unspawn(op)
    return waits


async def _flood(url: str, address: str, answered: asyncio.Event, count: int = 2000, first: int = 200) -> None:
    """`count` made-up tokens at once from `address`; `answered` set once `first` are answered."""
    import aiohttp

    done = 0
    connector = aiohttp.TCPConnector(limit=0, local_addr=(address, 0))
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> None:
            nonlocal done
            async with session.get(url, headers={"Authorization": f"Bearer junk-{address}-{i}"}) as resp:
                await resp.read()
            done += 1
            if done == first:
                answered.set()

        await asyncio.gather(*(one(i) for i in range(count)))


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    cpus = sum(1 for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("processor"))
    return f"{cpu}, {cpus} CPUs; Python {platform.python_version()}, {ssl.OPENSSL_VERSION}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parts", default="ca")
    parser.add_argument("--rounds", type=int, default=5, help="fresh clients per bundle; medians")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    print(f"machine: {machine()}")
    if "payload" in parts:
        payload_rows = bench_payload()
        print("\n| gRPC request | converted | took | allocated at the peak | outcome |")
        print("|---|---|---:|---:|---|")
        for what, how, took, peak, outcome in payload_rows:
            print(f"| {what} | {how} | {took * 1000:,.0f} ms | {peak:,.0f} MiB | {outcome} |")
    if "stream" in parts:
        stream_rows = asyncio.run(bench_stream())
        print("\n| `Call` on an endless stream (in process) | items held | took | ended |")
        print("|---|---:|---:|---|")
        for what, items, took, ended in stream_rows:
            print(f"| {what} | {items:,} | {took:.2f} s | {ended} |")
    if "metrics" in parts:
        waits = asyncio.run(bench_metrics(args.rounds))
        print(f"\n| Prometheus's scrape during 2,000 junk tokens ({args.rounds} rounds) | median | longest |")
        print("|---|---:|---:|")
        print(f"| waited | {statistics.median(waits) * 1000:,.0f} ms | {max(waits) * 1000:,.0f} ms |")
    if "ca" in parts:
        rows = asyncio.run(bench_ca(args.rounds))
        print(f"\n| CA bundle (medians of {args.rounds} clients) | bytes | before: loop stall, every download "
              "| now: first download's longest stall | now: 5 later downloads' longest | bundle reads |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|")
        for what, size, was, first, later, reads in rows:
            print(f"| {what} | {size:,} | {was:.1f} ms | {first:.1f} ms | {later:.1f} ms | {reads:g} |")
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"\n({time.monotonic() - started:.0f} s)", file=sys.stderr)
    sys.exit(code)
