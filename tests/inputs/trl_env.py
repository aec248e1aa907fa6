"""Tools and an environment written for TRL 1.16's GRPOTrainer (`tools=[...]`, `environment_factory=...`),
used unchanged by tests/episodes/test_episodes.py: typed functions with Google-style docstrings, and a class with
`reset(**row)`, public methods as tools and `get_reward()`."""

import asyncio
import random
import sys
import time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def broken(x: int) -> str:
    """A tool that always fails.

    Args:
        x: Any integer.
    """
    raise ValueError(f"cannot handle {x}")


def slow(x: int) -> str:
    """A tool that never answers in time.

    Args:
        x: Any integer.
    """
    time.sleep(30)
    return "late"


async def fetch(key: str) -> str:
    """An async tool, as TRL accepts them.

    Args:
        key: What to fetch.
    """
    await asyncio.sleep(0)
    return f"value of {key}"


def quits(x: int) -> str:
    """A tool that tries to end the process.

    Args:
        x: Any integer.
    """
    sys.exit(1)


def numbers(n: int) -> list:
    """A tool that returns a list, not a string.

    Args:
        n: How many numbers.
    """
    return list(range(n))


class Counter:
    """A counter the model must bring to the row's answer: increment it, read it, then answer."""

    prompts = []  # what every reset() was given as the prompt

    def reset(self, **kwargs):
        Counter.prompts.append(kwargs["prompt"])
        self.target = int(kwargs["answer"])
        self.value = 0
        self.salt = random.random()  # seeded by the trainer per episode: the same in every run
        return f" (start at {self.value})"

    def increment(self, step: int) -> str:
        """Add to the counter.

        Args:
            step: How much to add.
        """
        self.value += step
        return f"counter is {self.value}"

    def read(self) -> int:
        """The counter's value."""
        return self.value

    async def get_reward(self) -> float:  # TRL accepts an async get_reward (an LLM judge, say)
        return float(self.value == self.target)


class Guess:
    """A step environment (not tool calls): guess a number from higher/lower answers."""

    def reset(self, **kwargs):
        self.secret = int(kwargs["answer"])

    def step(self, text):
        digits = "".join(c for c in text if c.isdigit())
        guess = int(digits) if digits else -1
        if guess == self.secret:
            return "right", 1.0, True
        return ("higher" if guess < self.secret else "lower"), 0.0, False


def look(thing: str, times: int = 1) -> list:
    """A tool whose result is content parts (as a multimodal tool returns them).

    Args:
        thing: What to look at.
        times: How many times to say it.
    """
    return [{"type": "text", "text": f"a picture of {thing}" * times}, {"type": "image", "url": f"file://{thing}.png"}]


class Doubling:
    """An environment that owns its data (TRL's environment_factory with no train_dataset): reset() draws a
    number and asks for it doubled; the model answers through a tool; get_reward() checks it."""

    resets = []  # what every reset() was given

    def reset(self, **kwargs):
        Doubling.resets.append(kwargs)
        self.n, self.given = random.randint(1, 10**6), None
        return f"What is {self.n} doubled? Call answer."

    def answer(self, value: int) -> str:
        """Give the answer.

        Args:
            value: The doubled number.
        """
        self.given = value
        return "noted"

    def get_reward(self) -> float:
        return float(self.given == 2 * self.n)


def crash() -> str:
    """A tool whose process dies under it (a segfault in native code, the OOM killer)."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def spin(n: int) -> str:
    """A tool stuck in native code that never returns to Python (a regular expression that backtracks
    for ever, holding the interpreter lock).

    Args:
        n: How long the input is.
    """
    import re

    return str(re.match(r"(a+)+$", "a" * n + "b"))


def hog(gib: float) -> str:
    """A tool that allocates `gib` GiB.

    Args:
        gib: How much.
    """
    return str(len(bytearray(int(gib * 2**30))))
