"""Small text task classes used by the tests through `env.id: text_tasks_for_tests:<Class>`,
as a user's own tasks are named."""

from __future__ import annotations

import numpy as np

from agentenv_jax.envs.text import TaskReply


class GuessDigit:
    """Guess a digit in 0..`top` within `max_turns` messages; replies `higher` or `lower`."""

    max_turns = 3

    def __init__(self, top: int = 3):
        if top < 0:
            raise ValueError(f"top must be >= 0, got {top}")
        self.top = top
        self.target = 0

    def reset(self, rng: np.random.Generator) -> str:
        self.target = int(rng.integers(self.top + 1))
        return f"Guess a digit from 0 to {self.top}."

    def reply(self, message: str) -> TaskReply:
        guess = message.strip()
        if guess == str(self.target):
            return TaskReply(text=None, reward=1.0, done=True, success=True)
        hint = "higher" if guess.isdigit() and int(guess) < self.target else "lower"
        return TaskReply(text=hint, reward=0.0, done=False, success=False)


class SystemPromptTask:
    """A single-turn task whose prompt is chat messages, a system turn first."""

    max_turns = 1

    def reset(self, rng: np.random.Generator) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": "Answer yes."},
            {"role": "user", "content": "Ready?"},
        ]

    def reply(self, message: str) -> TaskReply:
        ok = message.strip() == "yes"
        return TaskReply(text=None, reward=float(ok), done=True, success=ok)


class ResetOnly:
    """Not a task: no `reply`."""

    max_turns = 1

    def reset(self, rng: np.random.Generator) -> str:
        return "?"


class NoMaxTurns:
    """A task without `max_turns`."""

    def reset(self, rng: np.random.Generator) -> str:
        return "?"

    def reply(self, message: str) -> TaskReply:
        return TaskReply(text=None, reward=0.0, done=True, success=False)
