"""The graph registry client: the only place servegraph talks to a registry."""

from servegraph.source.fetch import Fetched, FetchError, FetchRequest, fetch, safe_url

__all__ = ["FetchError", "FetchRequest", "Fetched", "fetch", "safe_url"]
