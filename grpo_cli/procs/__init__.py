"""Helper processes (spawn, framed messages, deadlines, how they ended) and weight transports."""
