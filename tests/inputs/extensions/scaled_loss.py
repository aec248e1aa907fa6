"""A policy loss of one's own: REINFORCE scaled by a setting of its own, -scale * A * log pi per token."""

from grpo_cli.algo.losses import register_loss


@register_loss("scaled_pg", metrics=("scaled_pg_weight",), scale=1.0)
def scaled_pg(t):
    weight = t.ratio.detach() * 0 + t.args["scale"]
    return -weight * t.advantages * t.logp, {"scaled_pg_weight": weight}
