"""Stopping well: the first Ctrl-C or SIGTERM lets the current step finish and a checkpoint be
written; a second one stops at once."""

from __future__ import annotations

import signal
import threading


class Stopped(Exception):
    """Training stopped on a signal after saving; exit with the conventional 128 + signal number."""

    def __init__(self, signum: int, step: int, resume: str | None = None):
        self.signum, self.step = signum, step
        self.exit_code = 128 + signum
        again = f"; continue with: {resume}" if resume else ""
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; checkpoint saved{again}")


class GracefulStop:
    """Context manager: `.signum` is set by the first SIGINT/SIGTERM; the second raises at once.

    `on_first(signum)` (the announcement) runs on a thread of its own, started on entry and woken by
    the handler: a Python signal handler runs in the main thread wherever it interrupted it (mid-print,
    mid-import, holding a lock), so it only records the signal and sets an Event. Seen when the
    handler printed itself: rich, importing its emoji table for a step's line, was interrupted by
    SIGTERM, and the warning's print imported the half-initialized module (ImportError)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, on_first=lambda signum: None):
        self.signum: int | None = None
        self._on_first = on_first
        self._previous = {}
        self._wake = threading.Event()
        self._announcer = threading.Thread(target=self._announce, name="graceful-stop", daemon=True)

    def _announce(self) -> None:
        self._wake.wait()
        if self.signum is not None:
            self._on_first(self.signum)

    def _handle(self, signum, frame):
        if self.signum is not None:  # the second signal: stop now, whatever is running
            raise KeyboardInterrupt
        self.signum = signum
        self._wake.set()

    def __enter__(self):
        self._announcer.start()
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._wake.set()  # no signal: the announcer ends; after one, its message comes before what follows
        self._announcer.join(timeout=5)
        return False
