"""The operating system's guard: namespaces, a read-only view and seccomp for the code reward's tests and environment
workers."""
