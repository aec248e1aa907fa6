"""The one exception type for user mistakes: the CLI prints its message (no trace) and exits 2."""


class GrpoError(Exception):
    """A problem the user can fix; the message is one sentence naming the problem and the fix."""
