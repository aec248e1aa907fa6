"""A generator back-end of one's own: the model's own decode, always greedy (one completion per prompt,
repeated), whatever sampler.temperature says."""

from dataclasses import replace

from grpo_cli.generate.base import register_generator
from grpo_cli.generate.hf import HFGenerator


class GreedyGenerator(HFGenerator):
    calls = 0

    def generate(self, model, prompts, group_size, sampling, seeds=None, *, with_logprobs=False):
        GreedyGenerator.calls += 1
        greedy = replace(sampling, temperature=0.0)
        return super().generate(model, prompts, group_size, greedy, seeds, with_logprobs=with_logprobs)


register_generator("greedy", GreedyGenerator)
