"""The builders of the package's built-in models (grpo_cli/assets/): the warm-ups that trained them, run by
scripts/build_tiny_model.py and by the tests, which build the tiny model afresh. Not part of the package: a run
loads the built assets."""
