"""The rollout stage: the rollout source and its worker, generators, episodes and environments, prompts and their data, held-out scores."""
