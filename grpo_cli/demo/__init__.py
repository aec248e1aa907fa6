"""The built-in demo: the tiny models trained at build time and the calculator tool."""
