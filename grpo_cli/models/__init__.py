"""Models and their forward: loading, the hub, LoRA, precision, data parallelism, threads, the packer, token log-probs, the policies by role."""
