"""The run: the loop, building and finishing a run, the config's checks, the memory plan, checkpoints, the console,
health rules, signals, trackers, publishing."""
