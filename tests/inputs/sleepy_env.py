"""An environment that is slow and draws random numbers the ways TRL environments do
(tests/episodes/test_concurrent_episodes.py, scripts/bench_episodes.py): Python's and NumPy's global generators, and
its own `self.rng`. `reset` and the tool
sleep DELAY seconds, plus up to JITTER seconds drawn from a generator of its own that nothing seeds, so the calls
finish in a different order every run."""

import os
import random
import time

import numpy as np

DELAY = float(os.environ.get("SLEEPY_DELAY", 0))  # seconds every reset and tool call sleeps (the variables reach
JITTER = float(os.environ.get("SLEEPY_JITTER", 0))  # environment workers); up to JITTER seconds more, at random
_latency = random.Random()  # unseeded on purpose: real latencies do not repeat


def _wait() -> None:
    time.sleep(DELAY + _latency.uniform(0, JITTER))


class Sleepy:
    """Each look(k) answers with draws from the global generators and the episode's own."""

    def reset(self, **kwargs):
        _wait()
        self.draws = [random.randint(0, 999), int(np.random.randint(1000))]
        return None

    def look(self, k: int) -> str:
        """Look at slot k.

        Args:
            k: The slot.
        """
        _wait()
        draws = (random.randint(0, 999), np.random.randint(1000), self.rng.randint(0, 999), self.np_rng.integers(1000))
        return ":".join(map(str, (k, *draws)))
