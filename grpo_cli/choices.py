"""The allowed values of every enumerated option, in one place that imports nothing heavy, so the
config is checked before torch or transformers load (config.py) and the code that acts on a value
(objective.py, precision.py, ...) uses the same tuples."""

ADVANTAGE_SCALES = ("group", "batch", "none")
STD_KINDS = ("population", "sample")
KL_ESTIMATORS = ("k1", "k2", "k3")
RATIO_LEVELS = ("token", "sequence", "sequence_mean")
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "constant_norm")
BEHAVIOURS = ("current", "frozen", "lagged")
PRECISIONS = ("fp32", "bf16-mixed", "bf16")  # training: see precision.py
INFERENCE_PRECISIONS = ("fp32", "bf16", "fp16")  # evaluate and sample: the weights' dtype
