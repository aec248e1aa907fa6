"""The tool demos written as ordinary agents (`experiment=tool_agent`, `experiment=chain_agent`): each calls the
model through the OpenAI SDK's client, runs its tools itself and scores its own final answer, as an agent written
for any OpenAI-compatible server would. The trainer serves the client's requests (grpo_cli/episodes/agent.py)."""

import json

import openai

from grpo_cli.demo.tools import Links, add
from grpo_cli.rewards.exact_match import is_correct


def schema(name: str, description: str, arguments: dict, required: list[str], returns: dict) -> dict:
    """A function's schema as OpenAI's tools take it (and as transformers' get_json_schema writes a typed one)."""
    parameters = {"type": "object", "properties": arguments, "required": required}
    function = {"name": name, "description": description, "parameters": parameters, "return": returns}
    return {"type": "function", "function": function}


ADD = schema(
    "add",
    "Add two whole numbers.",
    {
        "a": {"type": "integer", "description": "The first number."},
        "b": {"type": "integer", "description": "The second number."},
    },
    ["a", "b"],
    {"type": "integer", "description": "The sum a + b."},
)
FOLLOW = schema(
    "follow",
    "Look up where a letter links to.",
    {"key": {"type": "string", "description": "The letter to look up, a to z."}},
    ["key"],
    {"type": "string", "description": "The letter it links to."},
)


async def calculator(client, model, row, max_turns: int = 3) -> float:
    """Three-digit sums with a calculator: 1.0 when the last reply's number is the sum."""
    final = await episode(client, model, row["prompt"], [ADD], {"add": add}, max_turns)
    return float(is_correct(final, row["answer"]))


async def links(client, model, row, max_turns: int = 4) -> float:
    """Two-hop lookups in the row's own table, one letter at a time: 1.0 when the last reply is the letter reached."""
    table = Links()
    table.reset(**row)
    final = await episode(client, model, row["prompt"], [FOLLOW], {"follow": table.follow}, max_turns)
    return float(is_correct(final, row["answer"], extract="full"))


async def episode(client, model, prompt: list[dict], tools: list[dict], functions: dict, max_turns: int) -> str:
    """Ask, run the calls the model makes, answer them, until it answers without a call; the last reply's text."""
    messages = list(prompt)
    for _ in range(max_turns):
        try:
            response = await client.chat.completions.create(model=model, messages=messages, tools=tools)
        except openai.BadRequestError:  # the episode is out of tokens (the run's env.max_tokens): it ends here
            break
        reply = response.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            content = run_tool(functions, call.function)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    return next((m.get("content") or "" for m in reversed(messages) if m["role"] == "assistant"), "")


def run_tool(functions: dict, function) -> str:
    """A call's result as the model reads it (an error as the in-process driver words it)."""
    if function.name not in functions:
        return str({"error": f"Tool {function.name} not found."})
    try:
        return str(functions[function.name](**json.loads(function.arguments)))
    except Exception as e:
        return str({"error": str(e)})
