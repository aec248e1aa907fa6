"""The run: the loop, building and finishing it, the memory plan, checkpoints, the console, health, trackers."""
