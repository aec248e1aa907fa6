"""The update: one GRPO step on a scored rollout, and the learning-rate schedules."""
