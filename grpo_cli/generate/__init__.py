"""Generation: the generator protocol and registry, hf with its decode steps, vllm."""
