"""The flat sample and what describes it: the Rollout, the sampling and step settings, a step's metrics."""
