"""The rollout stage: which graph version runs, kept graphs for rollbacks, suspend, restart, why a rollout is stuck."""
