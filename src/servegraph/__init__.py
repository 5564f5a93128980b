"""servegraph: run serving graphs on Ray in Kubernetes.

Kept import-free on purpose: `servegraph.runtime` runs inside Ray clusters that
have nothing but `ray` installed, and importing the package must not pull in the
operator's dependencies.
"""

__version__ = "0.1.0"
