"""The graph registry client: the only place servegraph talks to a registry."""

from servegraph.source.fetch import Fetched, FetchError, FetchRequest, Limits, RegistryClient
from servegraph.source.guard import SourcePolicy, safe_url

__all__ = ["FetchError", "FetchRequest", "Fetched", "Limits", "RegistryClient", "SourcePolicy", "safe_url"]
