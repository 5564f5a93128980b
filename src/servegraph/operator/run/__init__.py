"""The operator as a running process: kopf handlers, queue and workers, Lease, shards, events endpoint, metrics."""
