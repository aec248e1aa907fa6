"""The tool-use demo written as an ordinary agent (`experiment=tool_agent`): it calls the model through the
OpenAI SDK's client, runs the calculator itself and scores its own final answer, as an agent written for any
OpenAI-compatible server would. The trainer serves the client's requests (grpo_cli/episodes/agent.py)."""

import json

import openai

from grpo_cli.demo.tools import add
from grpo_cli.rewards.exact_match import is_correct

TOOLS = [  # add's schema, as OpenAI's tools take it
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two whole numbers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first number."},
                    "b": {"type": "integer", "description": "The second number."},
                },
                "required": ["a", "b"],
            },
            "return": {"type": "integer", "description": "The sum a + b."},
        },
    }
]


async def calculator(client, model, row, max_turns: int = 3) -> float:
    """Ask, run the calls the model makes, answer them, until it answers without a call: 1.0 when the last
    reply's number is the sum."""
    messages = list(row["prompt"])
    for _ in range(max_turns):
        try:
            response = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        except openai.BadRequestError:  # the episode is out of tokens (the run's env.max_tokens): it ends here
            break
        reply = response.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call.function)})
    final = next((m.get("content") or "" for m in reversed(messages) if m["role"] == "assistant"), "")
    return float(is_correct(final, row["answer"]))


def run_tool(function) -> str:
    """A call's result as the model reads it (an error as the in-process driver words it)."""
    if function.name != "add":
        return str({"error": f"Tool {function.name} not found."})
    try:
        return str(add(**json.loads(function.arguments)))
    except Exception as e:
        return str({"error": str(e)})
