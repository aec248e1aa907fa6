"""The run: the loop, building and finishing a run, the config's checks, checkpoints, the console, health rules, signals, trackers, publishing."""
