"""The one exception type for user mistakes: the CLI prints its message (no trace) and exits 2."""


class GrpoError(Exception):
    """A problem the user can fix; the message is one sentence naming the problem and the fix."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none), to quote in a GrpoError."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
