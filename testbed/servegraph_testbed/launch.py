"""etcd and kube-apiserver as processes: their command lines, and a start that survives a port race.

The flags live here, apart from ControlPlane's lifecycle, so that what the test API
server runs with (and why each flag is there) reads in one place.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable, Sequence
from pathlib import Path

from servegraph_testbed.binaries import Binaries
from servegraph_testbed.certs import PkiFiles
from servegraph_testbed.processes import Component, ComponentError, free_port, http_probe

ETCD_QUOTA_BYTES = 256 * 1024 * 1024
_PORT_RACE = "address already in use"

MakeComponent = Callable[[int], Component]
PortProbe = Callable[[int], tuple[bool, str]]


def etcd(binaries: Binaries, workdir: Path, port: int) -> Component:
    """A single-member etcd on loopback `port`, its data and log under `workdir`."""
    url = f"http://127.0.0.1:{port}"
    return Component(
        "etcd",
        [
            str(binaries.etcd),
            f"--data-dir={workdir / 'etcd'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            "--listen-peer-urls=http://127.0.0.1:0",  # single member: any port
            "--unsafe-no-fsync",  # throwaway data: skip the fsyncs that dominate start
            f"--quota-backend-bytes={ETCD_QUOTA_BYTES}",
            "--log-level=warn",  # the log tail on failure shows errors, not chatter
        ],
        workdir / "etcd.log",
    )


def etcd_ready(port: int) -> tuple[bool, str]:
    return http_probe(f"http://127.0.0.1:{port}/health")


def apiserver_argv(
    binaries: Binaries,
    workdir: Path,
    pki: PkiFiles,
    *,
    port: int,
    etcd_port: int,
    host: str,
    service_cidr: str,
    cluster: bool,
    audit: bool,
    extra_args: Sequence[str],
) -> list[str]:
    """kube-apiserver's flags; `extra_args` come last, and so override the defaults.

    `cluster`: configured for real controllers and kubelets (see ControlPlane);
    `audit`: log to workdir/audit.log under the policy in workdir/audit-policy.yaml.
    """
    argv = [
        str(binaries.kube_apiserver),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        f"--bind-address={host}",
        f"--advertise-address={host}",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'apiserver-certs'}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--service-account-issuer=https://{host}:{port}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={service_cidr}",
        f"--token-auth-file={workdir / 'tokens.csv'}",
        "--allow-privileged=true",
        # Skip work a one-user test server does not need: APF's bootstrap objects and
        # periodic checks, profiling, metrics polls.
        "--enable-priority-and-fairness=false",
        "--profiling=false",
        "--etcd-count-metric-poll-period=0",
        "--etcd-db-metric-poll-interval=0",
    ]
    if cluster:
        argv += [
            # Kubelets are authorized as nodes (only their own pods, secrets they mount).
            "--authorization-mode=Node,RBAC",
            f"--kubelet-client-certificate={pki.kubelet_client_cert}",
            f"--kubelet-client-key={pki.kubelet_client_key}",
            "--kubelet-preferred-address-types=InternalIP",
        ]
    else:
        argv += [
            "--authorization-mode=RBAC",
            # No controller-manager mints ServiceAccount tokens: the admission plugin would
            # reject every pod (envtest disables it too).
            "--disable-admission-plugins=ServiceAccount",
            # Nothing inside a cluster needs the `kubernetes` Service's endpoints.
            "--endpoint-reconciler-type=none",
        ]
    if audit:
        argv += [
            f"--audit-policy-file={workdir / 'audit-policy.yaml'}",
            f"--audit-log-path={workdir / 'audit.log'}",
            "--audit-log-mode=blocking",  # the event is on disk when the response is
            "--audit-log-maxbackup=0",
            # Never rotated: the default rotates at 100 MB, which a 10,000-ServeGraph bench
            # passes, and a mark taken before a rotation would count nothing after it.
            "--audit-log-maxsize=0",
        ]
    return argv + list(extra_args)


def start_on_port(
    make: MakeComponent,
    ready: PortProbe,
    fixed: int | None,
    *,
    host: str,
    timeout: float,
) -> tuple[Component, int]:
    """Start a component on `fixed` or a free port; with a free port, retry on a race."""
    attempts = 1 if fixed is not None else 3
    for attempt in range(1, attempts + 1):
        port = fixed if fixed is not None else free_port(host)
        component = make(port)
        component.start()
        try:
            component.wait_ready(functools.partial(ready, port), timeout)
        except ComponentError as e:
            component.stop()
            if attempt < attempts and _PORT_RACE in e.log_tail:
                continue
            raise
        return component, port
    raise AssertionError("unreachable")


def kubernetes_service_ip(service_cidr: str) -> str:
    """The ClusterIP of the `kubernetes` Service: the first address of the Service range."""
    return str(next(ipaddress.ip_network(service_cidr).hosts()))
