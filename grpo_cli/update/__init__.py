"""The update: the flat rollout batch, one GRPO step on it, the policies by role, a step's metrics."""
