"""Models and their forward: loading, the hub, LoRA, precision, data parallelism, threads, token log-probs, the packer, the memory planner."""
