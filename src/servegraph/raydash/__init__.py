"""Ray dashboard client and `servegraph up` / `down`: a graph straight onto a Ray cluster.

`client` speaks the dashboard's Serve REST API (the one KubeRay uses), `up`
renders a graph and deploys it through it, `local` starts a local head when
asked, and `command` is the CLI's view of it. Only `command` loads without the
`ray` extra, so this package imports nothing here.
"""
