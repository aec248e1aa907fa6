"""The one helper-process protocol of the trainer's helpers (reward workers, environment workers, the
generation worker): a `Helper` is a fresh interpreter (`python -m MODULE FD` through launch.py, which ties
its life to the trainer's before anything slow is imported; not a fork of the trainer with its threads and
devices) with a socket pair, pickled framed messages, a deadline on every answer, how it ended in words,
and its death with the trainer. `serve` is the helper's end: it sets the process up and sends back what its
handler raised.

A helper that runs code the trainer does not trust (a confined environment worker, env.sandbox=os) is
started `plain`: what it sends is read as plain data only (`plain_loads`: no class or function is
looked up, so a forged message cannot run code in the trainer), at most PLAIN_MAX_BYTES a message, of the
protocol's shape; once started, an error it reports is its own loss (raised as `lost`, the helper killed),
never a sentence that stops the run; and its output goes nowhere (it cannot write lines into the trainer's
log). It sends `to_plain(value)`."""

from __future__ import annotations

import io
import numbers
import os
import pickle
import signal
import socket
import subprocess
import sys
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from grpo_cli.errors import GrpoError


def how_it_ended(process: subprocess.Popen) -> str:
    """ "was killed by SIGKILL", "exited with code 7", or "closed its end of the pipe" (still running)."""
    try:
        code = process.wait(5)
    except subprocess.TimeoutExpired:
        return "closed its end of the pipe"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


PLAIN_MAX_BYTES = 256 * 2**20
PLAIN_TEXT_CHARS = 2000  # of an error a plain helper reports, shown


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("builtins", "complex"):  # the one plain type pickle names by its class
            return complex
        raise pickle.UnpicklingError(f"it holds {module}.{name}, which is not plain data")


def plain_loads(data: bytes):
    """A pickle of plain data (None, bool, int, float, complex, str, bytes, and lists, tuples, dicts, sets
    of them); anything that names a class or a function raises UnpicklingError before it is called."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def to_plain(value, depth: int = 0):
    """`value` as plain data: builtin scalars as they are, other numbers (NumPy's) as int or float, other
    strings as str, containers element by element, anything else as its str() (what the model would read
    of it); past 64 levels of nesting, str()."""
    kind = type(value)
    if value is None or kind in (bool, int, float, complex, str, bytes):
        return value
    if depth < 64 and kind in (list, tuple, set, frozenset):
        return kind(to_plain(v, depth + 1) for v in value)
    if depth < 64 and kind is dict:
        return {to_plain(k, depth + 1): to_plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


class HelperLost(GrpoError):
    """A helper process is gone or did not answer in time; the sentence says which and why."""


class Helper:
    """The trainer's end of a helper process: `send`, `receive` within a deadline, `kill`, `close`.
    `name` begins its sentences ("the generation worker was killed by SIGKILL while ..."); `lost` is the
    exception they are raised as."""

    def __init__(
        self,
        module: str,
        first: object,
        *,
        name: str,
        lost: type[GrpoError] = HelperLost,
        timeout_key: str = "",
        plain: bool = False,
    ):
        ours, theirs = socket.socketpair()
        quiet = subprocess.DEVNULL if plain else None
        self.process = subprocess.Popen(
            [sys.executable, "-m", "grpo_cli.procs.launch", str(os.getpid()), module, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=quiet,
            stderr=quiet,
        )
        theirs.close()  # the helper holds the only other end: its death is this end's EOF
        self.conn, self.name, self.lost, self.plain = Connection(ours.detach()), name, lost, plain
        self.answered = False  # whether it has answered once (started): a plain helper's errors after are its loss
        self.timeout_key = f" ({timeout_key})" if timeout_key else ""  # the setting a slow helper's sentence names
        self.send((list(sys.path), first))  # the trainer's path: the user's modules are found there too

    def send(self, message) -> None:
        try:
            self.conn.send_bytes(pickle.dumps(message))
        except OSError:
            raise self.lost(f"{self.name} {how_it_ended(self.process)}") from None

    def receive(self, timeout: float | None, doing: str):
        """The next message, within `timeout` seconds (None: no limit); a helper that does not answer in
        time is killed. The helper's own failures come back raised: its GrpoError as one, a bug with its
        trace."""
        if not wait([self.conn], timeout=timeout):
            self.process.kill()
            raise self.lost(f"{self.name} did not answer within {timeout:g} s while {doing}{self.timeout_key}")
        try:
            message = self._read()
        except (EOFError, OSError):
            raise self.lost(f"{self.name} {how_it_ended(self.process)} while {doing}") from None
        kind = message[0] if isinstance(message, tuple) and message else None
        if kind in ("error", "bug") and self.plain and self.answered:  # not the run's to stop: it may be hostile
            self.process.kill()
            raise self.lost(f"{self.name} stopped: {message[1]}")
        if kind == "error":
            raise GrpoError(message[1])
        if kind == "bug":
            raise RuntimeError(f"{self.name} failed:\n{message[1]}")
        self.answered = True
        return message

    def _read(self):
        if not self.plain:
            return pickle.loads(self.conn.recv_bytes())
        try:
            data = self.conn.recv_bytes(PLAIN_MAX_BYTES)
        except OSError as e:
            if "length" not in str(e):  # multiprocessing's "bad message length": a message past the cap
                raise
            self.process.kill()
            raise self.lost(f"{self.name} sent a message over {PLAIN_MAX_BYTES // 2**20} MiB and was stopped") from None
        try:
            message = plain_loads(data)
        except Exception as e:  # noqa: BLE001 - a malformed or forged message, whatever pickle raises
            self.process.kill()
            raise self.lost(f"{self.name} sent a message that is not plain data ({e}) and was stopped") from None
        if not (isinstance(message, tuple) and len(message) == 2 and isinstance(message[0], str)) or (
            message[0] in ("error", "bug") and not isinstance(message[1], str)
        ):
            self.process.kill()
            raise self.lost(f"{self.name} sent a message of no known shape and was stopped")
        if message[0] in ("error", "bug") and len(message[1]) > PLAIN_TEXT_CHARS:  # it may be hostile: cut short
            return message[0], message[1][:PLAIN_TEXT_CHARS] + " [...]"
        return message

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(5)
        self.conn.close()

    def close(self, grace_s: float = 10.0) -> None:
        """End the helper: its pipe closes and it exits; one that does not within `grace_s` is killed."""
        if self.process.poll() is None:
            self.conn.close()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def as_helper(memory_gib: float = 0.0) -> None:
    """In a helper process: die with the trainer (PR_SET_PDEATHSIG), leave Ctrl-C and SIGTERM to it (it
    finishes its step, saves, then closes its helpers), and keep to `memory_gib` of address space (0 = no
    limit; RLIMIT_AS)."""
    import resource

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform == "linux":  # elsewhere the pipe's EOF still ends an idle helper
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a killed trainer takes its helpers along
    if memory_gib > 0:
        limit = int(memory_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


class Channel:
    """The helper's end of the pipe: `receive` (None once the trainer has closed it) and `send`."""

    def __init__(self, fd: int):
        self.conn = Connection(fd)

    def receive(self):
        try:
            return pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            return None

    def send(self, message) -> None:
        self.conn.send_bytes(pickle.dumps(message))


def serve(handler: Callable[[Channel, object], None], memory_gib: Callable[[Any], float] = lambda first: 0.0) -> None:
    """A helper's main: read the first message (the trainer's path and the handler's settings), set the
    process up as a helper, and run `handler(channel, settings)`; a GrpoError goes back as its sentence,
    a bug with its trace; a trainer that has gone ends the helper quietly."""
    channel = Channel(int(sys.argv[1]))
    opening = channel.receive()
    if opening is None:  # the trainer ended before the helper started
        return
    try:
        path, first = opening
        sys.path[:] = path
        as_helper(memory_gib(first))
        handler(channel, first)
    except (BrokenPipeError, ConnectionResetError, EOFError):  # the trainer ended: no one to answer
        sys.exit(0)
    except GrpoError as e:
        _tell(channel, ("error", str(e)))
    except BaseException:  # noqa: BLE001 - sent to the trainer with its trace
        _tell(channel, ("bug", traceback.format_exc()))
        raise


def _tell(channel: Channel, message) -> None:
    """Send the helper's last word; a trainer that has already gone (it stopped on another helper's) hears none."""
    try:
        channel.send(message)
    except (BrokenPipeError, ConnectionResetError):
        sys.exit(0)
