"""Rewards scored in worker processes, one completion at a time, each with a deadline (`reward.workers`,
`reward.timeout_s`, `reward.worker_memory_gib`).

A reward is user code, or runs user (model-written) code: it can loop forever, crash the interpreter or
eat the machine's memory. Here each worker is a process of its own that builds the reward's terms
from the reward config, as the trainer does, and scores the completions it is sent, one per message:
the function sees the same arguments as in the training process, as lists of one. What can go wrong:

- the completion is not scored within `timeout_s` (a loop, a deadlock): the worker is killed;
- the worker dies (a segfault, `os._exit`, the kernel's OOM killer), or runs out of its address space
  (`worker_memory_gib`, RLIMIT_AS: a MemoryError);

How it works in detail: docs/internals.md, grpo_cli/rewards/reward_pool.py.
"""

from __future__ import annotations

import pickle
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from grpo_cli.errors import GrpoError
from grpo_cli.procs.subprocesses import Helper, how_it_ended

START_TIMEOUT_S = 300.0  # a worker builds the reward's terms (imports, maybe a model) before its first sample


@dataclass
class Failure:
    """A completion the pool could not score, and why, in words."""

    index: int
    why: str


class _Worker(Helper):
    """A reward worker process (`python -m grpo_cli.rewards.reward_worker`) and the completion it is scoring."""

    def __init__(self, cfg, memory_gib: float):
        super().__init__("grpo_cli.rewards.reward_worker", (cfg, memory_gib), name="a reward worker")
        self.ready, self.started, self.deadline = False, time.monotonic(), 0.0
        self.task: int | None = None  # the completion it scores


class RewardPool:
    """`workers` processes scoring the named terms of a reward config, one completion per task."""

    def __init__(self, cfg, workers: int, timeout_s: float, memory_gib: float = 0.0):
        self.cfg, self.size, self.timeout_s, self.memory_gib = cfg, workers, timeout_s, memory_gib
        self.workers: list[_Worker] = []

    def _fill(self) -> None:
        self.workers = [w for w in self.workers if w.process.poll() is None or w.task is not None]
        while len(self.workers) < self.size:
            self.workers.append(_Worker(self.cfg, self.memory_gib))

    def _messages(self, names: list[str], batch) -> list[bytes]:
        """Each completion's task, pickled once: (the terms, the completion's row)."""
        rows = []
        for i in range(len(batch)):
            try:
                rows.append(pickle.dumps((names, batch.row(i))))
            except Exception as e:  # environments of episodes, say, that cannot leave the process
                raise GrpoError(
                    f"reward.workers={self.size} sends each completion to a worker process, and completion {i} "
                    f"cannot be sent ({type(e).__name__}: {e}); set reward.workers=0 to score in the training process."
                ) from None
        return rows

    def score(self, names: list[str], batch) -> tuple[dict[str, list[float]], list[Failure]]:
        """Each named term's value for every completion of `batch` (NaN where it gave no score or failed),
        and the completions that failed. A term's GrpoError, or a bug in a built-in term, is raised here."""
        rows = self._messages(names, batch)
        values = {name: [float("nan")] * len(batch) for name in names}
        failures: list[Failure] = []
        todo = deque(range(len(batch)))
        self._fill()
        while todo or any(w.task is not None for w in self.workers):
            now = time.monotonic()
            for w in self.workers:
                if w.ready and w.task is None and todo:
                    w.task = todo.popleft()
                    w.deadline = now + self.timeout_s
                    w.conn.send_bytes(rows[w.task])
            waiting = [w for w in self.workers if w.task is not None or not w.ready]
            deadlines = [w.deadline if w.ready else w.started + START_TIMEOUT_S for w in waiting]
            ready = wait([w.conn for w in waiting], timeout=max(min(deadlines) - now, 0.0) if deadlines else None)
            now = time.monotonic()
            for w in waiting:
                why = self._answer(w, w.conn in ready, now, values)
                if why is None:
                    continue
                if w.task is None:  # died before its first sample: building the terms crashed it
                    self.close()
                    raise GrpoError(
                        f"A reward worker died while building the reward ({why}); set reward.workers=0 "
                        "to see the error in the training process."
                    )
                failures.append(Failure(w.task, why))
                w.task = None
                w.kill()
                self.workers.remove(w)
            self._fill()
        return values, sorted(failures, key=lambda f: f.index)

    def _answer(self, w: _Worker, readable: bool, now: float, values: dict) -> str | None:
        """Take worker `w`'s answer, if it has one: a ready note, or its task's values into `values`.
        Returns why its task failed (it ran out of memory, died, or ran past its deadline), or None."""
        reply: Any = None  # (kind, payload) as the worker sent it
        if readable:
            try:
                reply = w.conn.recv()
            except (EOFError, OSError):
                reply = None
        kind = reply[0] if reply is not None else None
        if kind == "ready":
            w.ready = True
        elif kind == "ok":
            for name, value in reply[1].items():
                values[name][w.task] = value
            w.task = None
        elif kind in ("error", "bug"):
            self.close()
            if kind == "error":
                raise GrpoError(reply[1])
            raise RuntimeError(f"a reward term failed in its worker process:\n{reply[1]}")
        elif kind == "oom":
            return reply[1]
        elif readable:  # EOF: the worker is gone
            return f"its worker {how_it_ended(w.process)}"
        elif now >= (w.deadline if w.ready else w.started + START_TIMEOUT_S):
            if not w.ready:
                self.close()
                raise GrpoError(
                    f"A reward worker did not start within {START_TIMEOUT_S:g} s; "
                    "check that the reward builds quickly, or set reward.workers=0."
                )
            return f"timed out after {self.timeout_s:g} s (reward.timeout_s)"
        return None

    def close(self) -> None:
        for w in self.workers:
            w.kill()
        self.workers = []
