"""The math of the objective: the clipped surrogate, the registered per-token losses and aggregations, the advantage
estimators."""
