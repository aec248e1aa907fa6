"""A tool-call format of one's own: each call on a line of its own, `CALL name {"argument": ...}`."""

import json
import re

from grpo_cli.episodes.tool_formats import register_tool_format

LINE = re.compile(r"^CALL (\w+) (\{.*\})\s*$")


@register_tool_format("bracket", detect=("'CALL '",))
def parse_bracket(text: str) -> tuple[str, list[dict]]:
    kept, calls = [], []
    for line in text.splitlines():
        found = LINE.match(line)
        if found is None:
            kept.append(line)
            continue
        try:
            calls.append({"name": found.group(1), "arguments": json.loads(found.group(2))})
        except ValueError as e:  # what the model reads back
            calls.append({"error": f"malformed tool call ({e}): {line[:80]!r}"})
    return "\n".join(kept).strip(), calls
