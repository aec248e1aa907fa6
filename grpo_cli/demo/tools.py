"""The demos' tools: the calculator of the tool-use demo (`experiment=tool_use`), a typed function with a
Google-style docstring, as TRL's `tools` take them (its schema reaches the chat template through
transformers' `get_json_schema`); and the multi-call demo's environment (`experiment=tool_chain`), a
class as TRL's `environment_factory` takes them."""


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.

    Returns:
        The sum a + b.
    """
    return int(a) + int(b)


class Links:
    """The environment of the multi-call demo (`experiment=tool_chain`, data=links): one instance per episode,
    holding its row's table of links, which the model reads one lookup at a time (TRL's environment_factory
    contract: `reset(**row)`, public methods are the tools)."""

    def reset(self, links: str, **row) -> None:
        self.links = {chr(ord("a") + i): to for i, to in enumerate(links)}

    def follow(self, key: str) -> str:
        """Look up where a letter links to.

        Args:
            key: The letter to look up, a to z.

        Returns:
            The letter it links to.
        """
        if key not in self.links:
            raise ValueError(f"no letter {key!r}; give one of a to z")
        return self.links[key]
