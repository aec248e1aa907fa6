"""Prompt data: the built-in tasks, files and hub datasets read through `datasets`, prompts rendered, the prompt
order."""
