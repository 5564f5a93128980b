"""The status stage: what a reconcile observed, as the ServeGraph's conditions, status and Events (pure)."""
