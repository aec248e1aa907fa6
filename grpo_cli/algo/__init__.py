"""The math of the objective: the clipped surrogate, the registered losses and aggregations, the advantages."""
