"""The commands besides training: composing and checking configs, --help, evaluate, sample, sweeps."""
