"""The calculator of the tool-use demo (`experiment=tool_use`): a typed function with a Google-style
docstring, as TRL's `tools` take them; its schema reaches the chat template through transformers'
`get_json_schema`."""


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.

    Returns:
        The sum a + b.
    """
    return int(a) + int(b)
