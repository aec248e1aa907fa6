"""A reward worker process (reward_pool.py starts it as `python -m grpo_cli.reward_worker FD`): it
limits itself, builds the reward's terms from the config it is sent, and scores one completion per
message on the socket FD until the trainer closes it."""

from __future__ import annotations

import sys
import traceback
from multiprocessing.connection import Connection

from grpo_cli.errors import GrpoError
from grpo_cli.rewards import build_reward
from grpo_cli.subprocesses import as_helper


def _serve(conn) -> None:
    """A worker: read its settings, build the terms, say ready, then score one completion per message
    until the pipe closes. Replies: ("ok", {term: value, NaN = no score}), ("error", sentence) for the
    user's mistake, ("oom", words) when the address space ran out, ("bug", traceback) for anything else."""
    path, cfg, memory_gib = conn.recv()
    sys.path[:] = path  # the trainer's: the user's modules are found as they were there
    as_helper(memory_gib)
    try:
        reward = build_reward(cfg, workers=False)
    except GrpoError as e:
        conn.send(("error", str(e)))
        return
    conn.send(("ready", None))
    while True:
        try:
            names, batch = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", {name: reward.term_values(name, batch)[0] for name in names}))
        except GrpoError as e:
            conn.send(("error", str(e)))
        except MemoryError:
            conn.send(("oom", f"ran out of memory (reward.worker_memory_gib={memory_gib:g})"))
            return  # its heap may be in pieces: a fresh worker takes over
        except BaseException:  # noqa: BLE001 - a built-in term's bug: sent back with its trace
            conn.send(("bug", traceback.format_exc()))


if __name__ == "__main__":
    try:
        _serve(Connection(int(sys.argv[1])))
    except (BrokenPipeError, ConnectionResetError, EOFError):  # the trainer closed the pool or ended: no one to answer
        sys.exit(0)
