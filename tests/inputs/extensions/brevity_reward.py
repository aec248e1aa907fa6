"""A reward of one's own: 1 for a completion of at most `limit` characters, less the longer it runs."""

from grpo_cli.rewards import register_reward


def build(cfg):
    limit = 4

    def brevity(batch):
        return [min(1.0, limit / max(len(c), 1)) for c in batch.completions]

    return brevity


register_reward("brevity", build, max_value=1.0)
