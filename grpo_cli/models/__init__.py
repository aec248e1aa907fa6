"""Models and their forward: loading, LoRA, precision, ranks, threads, the packer, token log-probs, the policies."""
