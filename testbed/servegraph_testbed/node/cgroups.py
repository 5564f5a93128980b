"""The node's cgroup root: one directory per cgroup v1 hierarchy, removed at teardown.

The kubelet (cgroupfs driver) puts every pod under `cgroupRoot`, and it refuses to
start unless that root exists in each hierarchy. Making it ours means teardown knows
exactly what to remove: the whole tree under it, deepest first.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def hierarchies() -> list[Path]:
    """Mount points of the cgroup v1 hierarchies (cgroup2 is not used on this machine kind)."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup":
            out.append(Path(fields[1]))
    return out


def create(name: str) -> None:
    """Make /<name> in every hierarchy (cpuset children need cpus and mems to hold tasks)."""
    for mount in hierarchies():
        path = mount / name
        path.mkdir(exist_ok=True)
        if (mount / "cpuset.cpus").exists():
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (path / knob).write_text((mount / knob).read_text())


def remove(name: str, timeout: float = 30.0) -> list[str]:
    """Remove /<name> and everything under it; returns what could not be removed."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for mount in hierarchies():
            root = mount / name
            if not root.exists():
                continue
            for dirpath, _, _ in sorted(os.walk(root), key=lambda w: -len(Path(w[0]).parts)):
                try:
                    os.rmdir(dirpath)
                except FileNotFoundError:
                    pass
                except OSError:  # still holds a task that is being killed
                    left.append(dirpath)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def container_pids(name: str, container_id: str) -> list[int]:
    """Host pids of container `container_id` under /<name>: its cgroup.procs in the pids hierarchy."""
    pids: list[int] = []
    for mount in hierarchies():
        if not (mount / "cgroup.procs").exists() or mount.name != "pids":
            continue
        for dirpath, _, _ in os.walk(mount / name):
            if Path(dirpath).name.endswith(container_id):
                pids += [int(p) for p in (Path(dirpath) / "cgroup.procs").read_text().split()]
    return pids


def leftovers(name: str) -> list[str]:
    return [str(m / name) for m in hierarchies() if (m / name).exists()]
