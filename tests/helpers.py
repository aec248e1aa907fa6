"""Small conveniences shared by the tests."""

from grpo_cli.generation import HFGenerator, Sampling


def generate(model, tokenizer, prompts, group_size=1, *, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
             greedy=False, seeds=None, chat_template=False, with_logprobs=False):
    """A Rollout of `group_size` completions per prompt, through the trainer's own generator."""
    sampling = Sampling(max_new_tokens, temperature, top_p, top_k, greedy)
    return HFGenerator(tokenizer, chat_template=chat_template).generate(
        model, list(prompts), group_size, sampling, seeds, with_logprobs=with_logprobs)


def floats(metrics: dict) -> dict:
    """policy_loss's metrics (0-d tensors) as Python floats."""
    return {k: float(v) for k, v in metrics.items()}
