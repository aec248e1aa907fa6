"""A reward worker process (reward_pool.py starts it as `python -m grpo_cli.rewards.reward_worker FD`, a
subprocesses.Helper): it limits itself, builds the reward's terms from the config it is sent, and scores
one completion per message until the trainer closes the pipe."""

from __future__ import annotations

import traceback

from grpo_cli.errors import GrpoError
from grpo_cli.procs.subprocesses import Channel, serve
from grpo_cli.rewards import build_reward


def _serve(channel: Channel, settings) -> None:
    """Build the terms, say ready, then score one completion per message until the pipe closes. Replies:
    ("ok", {term: value, NaN = no score}), ("error", sentence) for the user's mistake, ("oom", words) when
    the address space ran out, ("bug", traceback) for anything else."""
    cfg, memory_gib = settings
    reward = build_reward(cfg, workers=False)  # a GrpoError goes back as ("error", sentence)
    channel.send(("ready", None))
    while (message := channel.receive()) is not None:
        names, batch = message
        try:
            channel.send(("ok", {name: reward.term_values(name, batch)[0] for name in names}))
        except GrpoError as e:
            channel.send(("error", str(e)))
        except MemoryError:
            channel.send(("oom", f"ran out of memory (reward.worker_memory_gib={memory_gib:g})"))
            return  # its heap may be in pieces: a fresh worker takes over
        except BaseException:  # noqa: BLE001 - a built-in term's bug: sent back with its trace
            channel.send(("bug", traceback.format_exc()))


if __name__ == "__main__":
    serve(_serve, memory_gib=lambda settings: settings[1])
