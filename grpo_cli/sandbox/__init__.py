"""The operating system's guard: namespaces, a read-only view and seccomp for model-written code."""
