"""Agents for tests/episodes/test_agent.py, each written as a user would against the openai client, each
showing one behaviour the endpoint must handle."""

import asyncio
import importlib
import time

import openai

# the httpx library openai's client is built on (httpx, or httpx2 from openai 3)
httpx = importlib.import_module(openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0])


def ask(row) -> list:
    return list(row["prompt"])


async def raises(client, model, row):
    await client.chat.completions.create(model=model, messages=ask(row))
    raise RuntimeError("the agent's own bug")


async def returns_nan(client, model, row):
    await client.chat.completions.create(model=model, messages=ask(row))
    return float("nan")


async def hangs(client, model, row):
    await client.chat.completions.create(model=model, messages=ask(row))
    await asyncio.sleep(3600)


def hangs_in_a_plain_def(client, model, row):
    client.chat.completions.create(model=model, messages=ask(row))
    time.sleep(30)
    return 1.0


def plain_with_metrics(client, model, row):
    reply = client.chat.completions.create(model=model, messages=ask(row)).choices[0].message
    return {"reward": float(row["answer"] in (reply.content or "")), "replies": 1}


async def rewrites_history(client, model, row):
    """Asks, then asks again with the first exchange replaced by a summary of it."""
    first = (await client.chat.completions.create(model=model, messages=ask(row))).choices[0].message
    summary = [{"role": "user", "content": f"Earlier you said {first.content!r}. {row['prompt'][-1]['content']}"}]
    await client.chat.completions.create(model=model, messages=summary)
    return 0.0


async def picks_the_last_of_three(client, model, row):
    """Samples three replies at once and goes on with the last."""
    messages = ask(row)
    response = await client.chat.completions.create(model=model, messages=messages, n=3, max_tokens=12)
    messages.append(response.choices[2].message.model_dump(exclude_none=True))
    messages.append({"role": "user", "content": "Again."})
    await client.chat.completions.create(model=model, messages=messages, max_tokens=4)
    return 0.0


async def asks_twice_at_once(client, model, row):
    """Two requests in parallel (as an agent that fans out would); both answers are read."""
    replies = await asyncio.gather(
        client.chat.completions.create(model=model, messages=ask(row), max_tokens=8),
        client.chat.completions.create(
            model=model, messages=ask(row) + [{"role": "user", "content": "?"}], max_tokens=8
        ),
    )
    return float(len(replies))


async def gives_up_on_its_request(client, model, row):
    """Its client sends the request whole, then stops waiting for the answer after a millisecond."""
    try:
        await client.chat.completions.create(model=model, messages=ask(row), timeout=httpx.Timeout(5.0, read=0.001))
    except openai.APITimeoutError:
        await asyncio.sleep(1.0)  # the endpoint answers meanwhile, to a closed connection
    return 1.0


async def completes_text(client, model, row):
    """The completions route: the prompt grows by the reply and new text."""
    prompt = f"Q: {row['prompt'][-1]['content']}\nA:"
    first = (await client.completions.create(model=model, prompt=prompt, max_tokens=6)).choices[0].text
    prompt += first + "\nQ: again\nA:"
    await client.completions.create(model=model, prompt=prompt, max_tokens=6)
    return 0.0


async def ends_its_process(client, model, row):
    """Ends the process it runs in (an agent worker's), as a crash in native code would."""
    import os

    await client.chat.completions.create(model=model, messages=ask(row))
    os._exit(3)


async def forces_add(client, model, row):
    """Forces a call of add, then of any tool (required), answering each with the sum."""
    from grpo_cli.demo.agent import ADD

    messages, calls = ask(row), 0
    for choice in ({"type": "function", "function": {"name": "add"}}, "required"):
        response = await client.chat.completions.create(model=model, messages=messages, tools=[ADD], tool_choice=choice)
        reply = response.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        calls += len(reply.tool_calls or [])
        for call in reply.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "0"})
    return {"reward": 0.0, "calls": float(calls)}


async def asks_greedy(client, model, row):
    """Asks for temperature 0, as an agent tuned for a hosted model might."""
    await client.chat.completions.create(model=model, messages=ask(row), temperature=0, max_tokens=12)
    return 0.0


SEEN: list = []  # what asks_top_logprobs was answered, for the test to read (the agents run in its process)


async def asks_top_logprobs(client, model, row):
    response = await client.chat.completions.create(
        model=model, messages=ask(row), logprobs=True, top_logprobs=3, max_tokens=8
    )
    SEEN.append(response.choices[0].logprobs.model_dump())
    return 0.0


async def streams_the_calculator(client, model, row):
    """The demo calculator agent with stream=true: it puts each reply together from the deltas."""
    from types import SimpleNamespace

    from grpo_cli.demo.agent import ADD, run_tool
    from grpo_cli.demo.tools import add
    from grpo_cli.rewards.exact_match import is_correct

    messages, used, final = ask(row), 0, ""
    for _ in range(3):
        try:
            stream = await client.chat.completions.create(
                model=model, messages=messages, tools=[ADD], stream=True, stream_options={"include_usage": True}
            )
        except openai.BadRequestError:
            break
        content, calls = "", {}
        async for chunk in stream:
            used += chunk.usage.completion_tokens if chunk.usage else 0
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for c in choice.delta.tool_calls or []:
                    call = calls.setdefault(
                        c.index, {"id": c.id, "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                    call["function"]["name"] += c.function.name or ""
                    call["function"]["arguments"] += c.function.arguments or ""
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [calls[k] for k in sorted(calls)]
        messages.append(message)
        final = content
        if not calls:
            break
        for call in message["tool_calls"]:
            function = SimpleNamespace(**call["function"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": run_tool({"add": add}, function)})
    return {"reward": float(is_correct(final, row["answer"])), "completion_tokens": used}
