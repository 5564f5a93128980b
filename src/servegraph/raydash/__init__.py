"""Ray dashboard client and `servegraph up` / `down`: a graph straight onto a Ray cluster.

`dashboard` speaks the dashboard's Serve REST API (the one KubeRay uses), `up`
renders a graph and deploys it through it, and `local` starts a local head when
asked; `cli/deploy.py` is the command line's view of it. They need the `ray` extra;
this package root imports nothing, so the command line can read the defaults below
without it.
"""

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
DEFAULT_TIMEOUT_S = 300.0
