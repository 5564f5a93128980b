"""Processes run as an identity of one control plane: components it stops before itself
(spawn), and short commands (run, kubectl, helm) it can end when it stops.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from servegraph_testbed.binaries import Binaries
from servegraph_testbed.identities import ADMIN
from servegraph_testbed.processes import Component


class Host(Protocol):
    """What commands need of their control plane (a ControlPlane; each raises before start)."""

    @property
    def workdir(self) -> Path: ...

    @property
    def binaries(self) -> Binaries: ...

    def kubeconfig(self, identity: str = ADMIN) -> Path: ...

    def component_log(self, name: str) -> Path: ...


class Commands:
    """What ControlPlane's spawn/unspawn/run/kubectl/helm do; see their docstrings there."""

    def __init__(self, host: Host) -> None:
        self._host = host
        self.spawned: list[Component] = []
        """Running components, oldest first."""
        self._clients: set[subprocess.Popen[str]] = set()
        """kubectl/helm runs in flight (from any thread): kill_clients() ends them, see `run`."""
        self._clients_lock = threading.Lock()

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        *,
        identity: str | None = ADMIN,
        env: Mapping[str, str] | None = None,
    ) -> Component:
        if any(c.name == name for c in self.spawned):
            raise ValueError(f"a component named {name!r} is already running")
        full_env = dict(os.environ)
        if identity is not None:
            full_env["KUBECONFIG"] = str(self._host.kubeconfig(identity))
        full_env.update(env or {})
        component = Component(name, argv, self._host.component_log(name), full_env)
        component.start()
        self.spawned.append(component)
        return component

    def unspawn(self, component: Component) -> None:
        component.stop()
        if component in self.spawned:
            self.spawned.remove(component)

    def run(
        self,
        argv: Sequence[str],
        *,
        identity: str = ADMIN,
        stdin: str | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Tracked until it ends, so that kill_clients() can end it: a `kubectl rollout
        status` or `wait` left running in a thread (an interrupted start) would otherwise
        retry against the stopped API server until its own timeout, and keep pytest from
        exiting."""
        env = dict(os.environ, KUBECONFIG=str(self._host.kubeconfig(identity)))
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            env[var] = str(self._host.workdir / "helm" / var.lower())
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin is not None else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        with self._clients_lock:
            self._clients.add(proc)
        try:
            out, err = proc.communicate(stdin)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            with self._clients_lock:
                self._clients.discard(proc)
        result = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
        if check:
            result.check_returncode()
        return result

    def kubectl(
        self, *args: str, identity: str = ADMIN, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cache = f"--cache-dir={self._host.workdir / 'kubectl-cache'}"
        argv = [str(self._host.binaries.kubectl), cache, *args]
        return self.run(argv, identity=identity, stdin=stdin, check=check)

    def helm(self, *args: str, identity: str = ADMIN, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run([str(self._host.binaries.helm), *args], identity=identity, check=check)

    def take_spawned(self) -> list[Component]:
        """The running components, newest first (the order to stop them in), forgotten here."""
        spawned, self.spawned = self.spawned[::-1], []
        return spawned

    def kill_clients(self) -> None:
        """End every short command in flight, by pid; each `run` reaps its own."""
        with self._clients_lock:
            clients = list(self._clients)
        for proc in clients:
            proc.kill()
