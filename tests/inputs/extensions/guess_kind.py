"""An environment kind of one's own: a partner that answers each turn with `reply(text)`, a message for the
model or None to end the episode; the episode's reward is the partner's `score`."""

from grpo_cli.episodes.kinds import register_env_kind


@register_env_kind("reply", detect=lambda cls: callable(getattr(cls, "reply", None)))
def reply_turn(episodes, ep, ids, text, env_tokens, turn):
    ep.messages.append({"role": "assistant", "content": text})
    value, error = episodes.call(ep, ep.environment.reply, text)
    ep.reward = float(getattr(ep.environment, "score", 0.0))
    if error is None and value is None:
        ep.done = True
        return None
    answer = str({"error": error}) if error is not None else str(value)
    return [{"role": "user", "content": episodes.bounded(ep, answer)}], None


class Guess:
    """The arithmetic task as a dialogue: the partner says "again" until the model writes the answer."""

    replies: list[str] = []

    def reset(self, **row):
        self.answer, self.score = str(row["answer"]), 0.0

    def reply(self, text: str):
        Guess.replies.append(text)
        if text.strip() == self.answer:
            self.score = 1.0
            return None
        return "again"
