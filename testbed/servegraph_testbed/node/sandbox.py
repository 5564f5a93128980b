"""The node's init: pid 1 of its own pid and mount namespaces, inside its network namespace.

Started by NodeCluster as

    nsenter --net=/run/netns/sgnode-K -- unshare --pid --fork --kill-child --mount \\
        --propagation private --mount-proc -- python -m servegraph_testbed.node.sandbox SPEC.json

it mounts private tmpfs over the fixed host paths containerd and the CNI plugins use
(/run/containerd for shim sockets, /run/netns for pod network namespaces, /var/lib/cni
for the CNI cache), then runs containerd, the kubelet and kube-proxy and reaps orphans
(the shims reparent to it). Why this shape: when this process exits, the kernel kills
every process in the pid namespace — containerd, shims, every container — and the
mount namespace with all its mounts (overlay root filesystems, secret and token tmpfs,
pod network namespace files) goes with the last of them. Teardown cannot leave a
container, a mount or a network namespace behind, whatever state the test left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PRIVATE_TMPFS = ("/run/containerd", "/run/netns", "/var/lib/cni")


def command(netns_path: Path, spec_file: Path) -> list[str]:
    """The command line above, for NodeCluster to spawn, with the current interpreter."""
    return [
        "nsenter",
        f"--net={netns_path}",
        "--",
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount",
        "--propagation=private",
        "--mount-proc",
        "--",
        sys.executable,
        "-m",
        "servegraph_testbed.node.sandbox",
        str(spec_file),
    ]


def _mount_tmpfs(path: str) -> None:
    Path(path).mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", path], check=True)


def _start(name: str, argv: list[str], logs: Path) -> subprocess.Popen[bytes]:
    log = (logs / f"{name}.log").open("ab")
    log.write(f"=== {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
    log.flush()
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def _wait_socket(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise SystemExit(f"sandbox: containerd exited ({proc.returncode}) before creating {path}")
        if time.monotonic() > deadline:
            raise SystemExit(f"sandbox: no {path} after {timeout:.0f} s")
        time.sleep(0.05)


def _reap_one() -> int:
    """Reap one exited child or orphan without blocking; its pid, or 0."""
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return 0
    return pid


def main(spec_path: str) -> int:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    logs = Path(spec["logs"])
    if os.getpid() != 1:
        raise SystemExit("sandbox: must run as pid 1 of a new pid namespace (see the module docstring)")
    for path in PRIVATE_TMPFS:
        _mount_tmpfs(path)

    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    children: dict[str, subprocess.Popen[bytes]] = {}
    containerd = children["containerd"] = _start("containerd", spec["containerd"], logs)
    _wait_socket(Path(spec["containerd_socket"]), containerd, 60)
    for name in ("kubelet", "kube-proxy"):
        children[name] = _start(name, spec[name], logs)

    # Reap everything that ends up here; leave when told to or when a component dies
    # (the cluster notices that the node went away and reports the component's log).
    running = {p.pid: n for n, p in children.items()}
    while not stopping:
        pid = _reap_one()
        if pid in running:
            print(f"sandbox: {running.pop(pid)} exited; stopping the node", file=sys.stderr, flush=True)
            break
        if pid == 0:
            time.sleep(0.2)
    for pid in running:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while running and time.monotonic() < deadline:
        pid = _reap_one()
        running.pop(pid, None)
        if pid == 0:
            time.sleep(0.1)
    return 0  # leaving pid 1 kills whatever is left in the namespace


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
