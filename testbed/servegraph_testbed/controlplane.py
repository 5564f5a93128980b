"""A real Kubernetes control plane for tests and the demo: etcd + kube-apiserver, no kubelet.

What controller-runtime's envtest runs, plus what our tests need beyond it: RBAC with
static identities, a kubeconfig per identity, CRD installation, an optional audit log,
and the faults the chaos tests make under the operator: an API server restarted or
SIGKILLed (etcd kept), etcd stopped and started again on its data, etcd compacted.
There is no controller-manager: owner references are stored but never garbage
collected, namespaces never finish terminating, pods stay Pending.

This module is the lifecycle and what clients need; the flags are in launch.py, the
identities and tokens in identities.py, the commands run as an identity in commands.py.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from servegraph_testbed import etcd, launch
from servegraph_testbed.audit import DEFAULT_POLICY, AuditLog
from servegraph_testbed.binaries import Binaries, find_binaries
from servegraph_testbed.certs import PkiFiles, write_pki
from servegraph_testbed.commands import Commands
from servegraph_testbed.crds import install_crds, load_crds
from servegraph_testbed.identities import (
    ADMIN,
    Identity,
    default_identities,
    service_account_token,
    write_kubeconfig,
    write_token_file,
)
from servegraph_testbed.launch import kubernetes_service_ip
from servegraph_testbed.processes import Component, stop_at_exit
from servegraph_testbed.rest import Json, Rest

KEEP_ENV_VAR = "SERVEGRAPH_TESTENV_KEEP"  # set to 1 to keep the work dir (logs) after stop()

T = TypeVar("T")


class ControlPlane:
    """etcd and kube-apiserver on free loopback ports; use as a context manager or start()/stop().

    All state (PKI, tokens, kubeconfigs, etcd data, logs, audit log) lives in one temp
    dir removed by stop(). Every process runs in its own process group, stopped by pid.
    """

    def __init__(
        self,
        binaries: Binaries | None = None,
        *,
        identities: Iterable[Identity] | None = None,
        crds: Sequence[Path] = (),
        audit: bool = False,
        audit_policy: str = DEFAULT_POLICY,
        apiserver_args: Sequence[str] = (),
        etcd_port: int | None = None,
        apiserver_port: int | None = None,
        ready_timeout: float = 60.0,
        host: str = "127.0.0.1",
        service_cidr: str = "10.0.0.0/24",
        cluster: bool = False,
    ) -> None:
        """`crds`: YAML files or dirs installed at start; `apiserver_args` are appended last
        (and so override the defaults); a fixed port disables the retry on a port race.

        `host` is the address the API server binds and advertises (a node tier gives the
        address its node reaches it on). `cluster=True` configures it for real controllers
        and kubelets (see NodeCluster): ServiceAccount admission and the `kubernetes`
        Service's endpoints on, Node authorization before RBAC, a client cert for kubelets.
        """
        self._binaries = binaries
        idents = list(identities) if identities is not None else list(default_identities())
        self._identities = {i.name: i for i in idents}
        if ADMIN not in self._identities:
            raise ValueError(f"identities must include {ADMIN!r} (the harness acts as it)")
        self._crd_paths = list(crds)
        self._audit_policy = audit_policy if audit else None
        self._extra_apiserver_args = list(apiserver_args)
        self._fixed_etcd_port = etcd_port
        self._fixed_apiserver_port = apiserver_port
        self.ready_timeout = ready_timeout
        self.host = host
        self.service_cidr = service_cidr
        self.cluster = cluster

        self._workdir: Path | None = None
        self._pki: PkiFiles | None = None
        self._etcd: Component | None = None
        self._apiserver: Component | None = None
        self._commands = Commands(self)
        """Spawned components and kubectl/helm runs in flight: stop() ends them all."""
        self._installed_crds: dict[str, str] = {}
        self.etcd_port = 0
        self.apiserver_port = 0

    # ---- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start etcd, then kube-apiserver, wait for /readyz, install the CRDs.

        On any failure everything started so far is stopped and the temp dir removed
        before the error (a ComponentError carrying the log tail) propagates.
        """
        if self._workdir is not None:
            raise RuntimeError("control plane already started")
        binaries = self._binaries or find_binaries()
        self._binaries = binaries
        self._workdir = Path(tempfile.mkdtemp(prefix="servegraph-testenv-"))
        stop_at_exit(self.stop)
        try:
            self._pki = write_pki(self._workdir, ips=[self.host, kubernetes_service_ip(self.service_cidr)])
            write_token_file(self._workdir / "tokens.csv", self._identities.values())
            if self._audit_policy is not None:
                (self._workdir / "audit-policy.yaml").write_text(self._audit_policy)
            self._start_etcd(binaries)
            self._start_apiserver(binaries)
            for ident in self._identities.values():
                write_kubeconfig(self.kubeconfig(ident.name), self.server, self.ca_pem, ident)
            if self._crd_paths:
                self.install_crds(*self._crd_paths)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop spawned components, the API server, etcd (in that order); remove the temp dir.

        Safe to call twice and after a failed start.
        """
        atexit.unregister(self.stop)
        self._commands.kill_clients()
        components = [*self._commands.take_spawned(), self._apiserver, self._etcd]
        self._apiserver = self._etcd = None
        self._installed_crds.clear()
        workdir, self._workdir = self._workdir, None
        errors: list[Exception] = []
        for component in components:
            try:
                if component is not None:
                    component.stop()
            except Exception as e:  # keep stopping the others
                errors.append(e)
        if workdir is not None and os.environ.get(KEEP_ENV_VAR) != "1":
            shutil.rmtree(workdir, ignore_errors=True)
        if errors:
            raise errors[0]

    def restart_apiserver(self, downtime: float = 0.0, *, kill: bool = False) -> None:
        """Stop kube-apiserver (SIGTERM, or SIGKILL with `kill`: no graceful shutdown, what is in
        flight is cut), wait `downtime` s, start it again on the same port and etcd.

        Clients keep their kubeconfigs; the data survives. Blocking: from async code run
        it with `await asyncio.to_thread(cp.restart_apiserver)` so the loop keeps going.
        """
        apiserver = self._require(self._apiserver, "API server")
        if kill:
            apiserver.kill()
        else:
            apiserver.stop()
        time.sleep(downtime)
        apiserver.start()
        self._wait_apiserver_ready(apiserver)

    def stop_etcd(self) -> None:
        """Stop etcd; its data dir stays. The API server runs on, and every request that
        needs storage hangs until it times out (a storage outage)."""
        self._require(self._etcd, "etcd").stop()

    def start_etcd(self, *, wait_apiserver: bool = True) -> None:
        """Start etcd again on its port and data dir; wait until it is healthy and (unless told
        not to) until the API server is ready again, which re-initializes its storage first."""
        etcd = self._require(self._etcd, "etcd")
        etcd.start()
        etcd.wait_ready(lambda: launch.etcd_ready(self.etcd_port), self.ready_timeout)
        if wait_apiserver:
            self._wait_apiserver_ready(self._require(self._apiserver, "API server"))

    def compact_etcd(self) -> int:
        """Compact etcd's history to its current revision (returned): see etcd.compact."""
        self._require(self._etcd, "etcd")
        return etcd.compact(self.etcd_port)

    def _start_etcd(self, binaries: Binaries) -> None:
        def make(port: int) -> Component:
            return launch.etcd(binaries, self.workdir, port)

        self._etcd, self.etcd_port = launch.start_on_port(
            make, launch.etcd_ready, self._fixed_etcd_port, host=self.host, timeout=self.ready_timeout
        )

    def _start_apiserver(self, binaries: Binaries) -> None:
        pki = self._require(self._pki, "PKI")

        def make(port: int) -> Component:
            argv = launch.apiserver_argv(
                binaries,
                self.workdir,
                pki,
                port=port,
                etcd_port=self.etcd_port,
                host=self.host,
                service_cidr=self.service_cidr,
                cluster=self.cluster,
                audit=self._audit_policy is not None,
                extra_args=self._extra_apiserver_args,
            )
            return Component("kube-apiserver", argv, self.workdir / "kube-apiserver.log")

        def ready(port: int) -> tuple[bool, str]:
            return self._rest_at(port, ADMIN).probe("/readyz?verbose")

        self._apiserver, self.apiserver_port = launch.start_on_port(
            make, ready, self._fixed_apiserver_port, host=self.host, timeout=self.ready_timeout
        )

    def _wait_apiserver_ready(self, apiserver: Component) -> None:
        apiserver.wait_ready(lambda: self.rest().probe("/readyz?verbose"), self.ready_timeout)

    # ---- what clients need -------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        return self._require(self._workdir, "work dir")

    @property
    def binaries(self) -> Binaries:
        return self._require(self._binaries, "binaries")

    @property
    def server(self) -> str:
        """The API server URL, e.g. https://127.0.0.1:40123."""
        return f"https://{self.host}:{self.apiserver_port}"

    @property
    def ca_file(self) -> Path:
        return self._require(self._pki, "PKI").ca_cert

    @property
    def ca_pem(self) -> bytes:
        return self.ca_file.read_bytes()

    @property
    def pids(self) -> dict[str, int]:
        """Process ids (= process group ids) of every running component, by name."""
        components = [self._etcd, self._apiserver, *self._commands.spawned]
        return {c.name: c.pid for c in components if c is not None and c.pid is not None}

    @property
    def audit_log(self) -> AuditLog:
        """The API server's audit log (only with audit=True)."""
        if self._audit_policy is None:
            raise RuntimeError("audit logging is off: create the ControlPlane with audit=True")
        return AuditLog(self.workdir / "audit.log")

    def identity(self, name: str = ADMIN) -> Identity:
        return self._identities[name]

    def kubeconfig(self, identity: str = ADMIN) -> Path:
        """The kubeconfig file of a static identity (token auth, CA inline)."""
        if identity not in self._identities:
            raise KeyError(f"no identity {identity!r}; known: {sorted(self._identities)}")
        return self.workdir / f"kubeconfig-{identity}.yaml"

    def rest(self, identity: str = ADMIN) -> Rest:
        """A small sync REST client as `identity` (for setup code outside an event loop)."""
        return self._rest_at(self.apiserver_port, identity)

    def _rest_at(self, port: int, identity: str) -> Rest:
        return Rest(f"https://{self.host}:{port}", self.ca_file, self._identities[identity].token)

    def component_log(self, name: str) -> Path:
        """The log file of a component ('etcd', 'kube-apiserver' or a spawned name)."""
        return self.workdir / f"{name}.log"

    def install_crds(self, *paths: Path, timeout: float = 60.0) -> list[str]:
        """Apply every CRD found in the YAML files/dirs; wait until usable; return names.

        CRDs this control plane already installed unchanged are skipped: re-applying
        KubeRay's 4 MB of schemas costs seconds of API server work for nothing.
        """
        crds = load_crds(paths)
        fresh = [c for c in crds if self._installed_crds.get(c["metadata"]["name"]) != _digest(c)]
        install_crds(self.rest(), fresh, timeout)
        self._installed_crds.update({c["metadata"]["name"]: _digest(c) for c in fresh})
        return [c["metadata"]["name"] for c in crds]

    def service_account_token(self, namespace: str, name: str, expiration_seconds: int = 86400) -> str:
        """A real bound token (TokenRequest API) of ServiceAccount `namespace/name`.

        RBAC bindings to that ServiceAccount apply to it exactly as in a cluster. The
        namespace and ServiceAccount are created if missing.
        """
        return service_account_token(self.rest(), namespace, name, expiration_seconds)

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        """A kubeconfig file holding service_account_token(namespace, name)."""
        ident = Identity(f"sa-{namespace}-{name}", "", token=self.service_account_token(namespace, name))
        path = self.workdir / f"kubeconfig-{ident.name}.yaml"
        write_kubeconfig(path, self.server, self.ca_pem, ident)
        return path

    # ---- running as an identity (commands.py) --------------------------------------------

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        *,
        identity: str | None = ADMIN,
        env: Mapping[str, str] | None = None,
    ) -> Component:
        """Start a process attached to this control plane and stopped before it.

        KUBECONFIG is set to `identity`'s kubeconfig (None: leave the environment alone).
        Its output goes to component_log(name). Wait for it with `.wait_ready(probe, s)`.
        """
        return self._commands.spawn(name, argv, identity=identity, env=env)

    def unspawn(self, component: Component) -> None:
        """Stop a spawned component ahead of the control plane."""
        self._commands.unspawn(component)

    def run(
        self,
        argv: Sequence[str],
        *,
        identity: str = ADMIN,
        stdin: str | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run a short command as `identity` (KUBECONFIG set; Helm's homes in the work dir).

        Tracked until it ends, so that stop() can end it (see Commands.run).
        """
        return self._commands.run(argv, identity=identity, stdin=stdin, check=check)

    def kubectl(
        self, *args: str, identity: str = ADMIN, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """The pinned kubectl as `identity`, e.g. `cp.kubectl("apply", "-f", "-", stdin=y)`."""
        return self._commands.kubectl(*args, identity=identity, stdin=stdin, check=check)

    def helm(self, *args: str, identity: str = ADMIN, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The pinned Helm v3 as `identity`, e.g. `cp.helm("install", "sg", "charts/x")`."""
        return self._commands.helm(*args, identity=identity, check=check)

    @staticmethod
    def _require(value: T | None, what: str) -> T:
        if value is None:
            raise RuntimeError(f"control plane not started ({what} unavailable)")
        return value


def _digest(obj: Json) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()
