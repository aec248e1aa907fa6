"""The one exception type for user mistakes: the CLI prints its message (no trace) and exits 2."""


class GrpoError(Exception):
    """A problem the user can fix; the message is one sentence naming the problem and the fix."""


class SourceLost(GrpoError):
    """The rollout source cannot sample any more (a helper process died or stopped answering); the
    sentence says which and why."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none), to quote in a GrpoError."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def write_failure(what, e: OSError) -> GrpoError:
    """One sentence for a failed write: a full disk says so."""
    import errno

    why = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else (e.strerror or first_line(e))
    return GrpoError(
        f"Could not write {what} ({why}); nothing half-written was kept and the previous checkpoint is "
        "untouched: free space (or fix the directory) and continue with resume=auto."
    )
