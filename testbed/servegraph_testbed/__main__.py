"""`python -m servegraph_testbed`: run the control plane by hand, or time its warm start.

python -m servegraph_testbed            # up until Ctrl-C; prints kubeconfig paths
python -m servegraph_testbed --kuberay  # ... with the KubeRay operator
python -m servegraph_testbed --time 5   # start/stop 5 times, print seconds to /readyz
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from contextlib import ExitStack, suppress

from servegraph_testbed.binaries import find_binaries
from servegraph_testbed.controlplane import ControlPlane
from servegraph_testbed.kuberay import KubeRayOperator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servegraph_testbed", description=__doc__)
    parser.add_argument("--kuberay", action="store_true", help="also run the KubeRay operator")
    parser.add_argument("--audit", action="store_true", help="write the API server audit log")
    parser.add_argument("--time", type=int, metavar="N", help="time N warm starts and exit")
    args = parser.parse_args(argv)
    binaries = find_binaries()

    if args.time:
        durations = []
        for i in range(args.time):
            started = time.monotonic()
            with ControlPlane(binaries, audit=args.audit):
                durations.append(time.monotonic() - started)
            print(f"run {i + 1}: {durations[-1]:.2f} s to /readyz", flush=True)
        print(f"median {statistics.median(durations):.2f} s, min {min(durations):.2f} s")
        return 0

    with ExitStack() as stack:
        cp = stack.enter_context(ControlPlane(binaries, audit=args.audit))
        if args.kuberay:
            stack.enter_context(KubeRayOperator(cp))
        print(f"API server {cp.server}; work dir {cp.workdir}")
        for name in ("admin", "servegraph-operator", "kuberay-operator", "restricted-user"):
            print(f"  KUBECONFIG={cp.kubeconfig(name)}")
        print("Ctrl-C to stop", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
