"""`SumsEnvironment`: an OpenEnv environment written as any OpenEnv user writes one, which the
shipped experiment `openenv_sums_smollm2` trains through the OpenEnv adapter, in process or
served by OpenEnv's own server:

    agentenv train openenv_sums_smollm2
    uvicorn --factory agentenv_jax.envs.text.openenv_sums:make_app --port 8000
    agentenv train openenv_sums_smollm2 --set env.kwargs.base_url=http://127.0.0.1:8000

A question is the sum of `terms` numbers of up to `digits` digits ("What is 3 + 8?"); the
answer is read as the last integer of the message. A right answer ends the episode with reward
1 on the first attempt and `retry_reward` (0.5) on a later one; a wrong one is told so and asked
again, until `attempts` (2) are used up (reward 0). The question is drawn from `reset`'s seed.
It needs the optional extra `pip install 'agentenv_jax[openenv]'`.
"""

from __future__ import annotations

import os
import random
import re
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app

_INTEGER = re.compile(r"-?\d+")
# Concurrent sessions `make_app`'s server allows: at least one per env copy of a run.
SESSIONS_VARIABLE = "OPENENV_SUMS_SESSIONS"


class AnswerAction(Action):
    answer: str


class QuestionObservation(Observation):
    text: str = ""


class SumsEnvironment(Environment[AnswerAction, QuestionObservation, State]):
    """Sums to answer within a few attempts (see the module docstring)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self, terms: int = 2, digits: int = 1, attempts: int = 2, retry_reward: float = 0.5
    ):
        super().__init__()
        if terms < 2 or digits < 1 or attempts < 1:
            raise ValueError(
                f"terms = {terms}, digits = {digits}, attempts = {attempts}: expected terms >= 2, "
                "digits >= 1 and attempts >= 1"
            )
        self.terms, self.digits, self.attempts = terms, digits, attempts
        self.retry_reward = retry_reward
        self._state = State(step_count=0)
        self._numbers: list[int] = []

    @property
    def question(self) -> str:
        return f"What is {' + '.join(map(str, self._numbers))}? Answer with the number only."

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> QuestionObservation:
        draw = random.Random(seed)
        self._numbers = [draw.randrange(10**self.digits) for _ in range(self.terms)]
        self._state = State(episode_id=episode_id, step_count=0)
        return QuestionObservation(text=self.question)

    def step(
        self, action: AnswerAction, timeout_s: float | None = None, **kwargs: Any
    ) -> QuestionObservation:
        self._state.step_count += 1
        numbers = _INTEGER.findall(action.answer)
        if numbers and int(numbers[-1]) == sum(self._numbers):
            reward = 1.0 if self._state.step_count == 1 else self.retry_reward
            return QuestionObservation(text="Right.", reward=reward, done=True)
        if self._state.step_count >= self.attempts:
            return QuestionObservation(text="Wrong.", reward=0.0, done=True)
        return QuestionObservation(
            text=f"That is not right. Try again: {self.question}", reward=0.0, done=False
        )

    @property
    def state(self) -> State:
        return self._state


def make_app() -> Any:
    """The env served by OpenEnv's own app (`uvicorn --factory ...:make_app`), allowing
    `$OPENENV_SUMS_SESSIONS` (default 64) concurrent sessions."""
    return create_app(
        SumsEnvironment,
        AnswerAction,
        QuestionObservation,
        max_concurrent_envs=int(os.environ.get(SESSIONS_VARIABLE, "64")),
    )
