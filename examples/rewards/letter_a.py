"""The quickstart's reward: the share of the letter 'a' in each completion.

Simple on purpose: a tiny random model can learn it in a few dozen GRPO steps on a CPU, so the
reward visibly rises. Real rewards score correctness (see the README)."""


def reward(completions, **kwargs):
    return [completion.count("a") / max(len(completion), 1) for completion in completions]
