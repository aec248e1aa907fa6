"""Prompt data: the built-in tasks, files and hub datasets, prompts rendered, the prompt order."""
