"""The rollout stage's one door: the rollout source, its worker process, and held-out scores."""
