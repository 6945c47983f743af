"""A small OpenEnv environment for tests/test_openenv.py, named as a user's would be
(`openenv_envs_for_tests:GuessFruitEnvironment`): guess a fruit, run in process or served by
OpenEnv's own server (`uvicorn --factory openenv_envs_for_tests:make_app`), with its typed
client and action classes that cannot carry a message."""

from __future__ import annotations

import os
import random
from typing import Any

from fastapi import FastAPI
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

FRUITS = ("apple", "grape", "lemon")  # first letters differ: a hint names the fruit
CRASH = "crash"  # a guess the env raises on, as a server failing mid-episode
# Concurrent sessions `make_app`'s server allows (one per env copy).
SESSIONS_VARIABLE = "OPENENV_TEST_SESSIONS"


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    feedback: str = ""
    attempts_left: int = 0


class GuessFruitEnvironment(Environment[GuessAction, GuessObservation, State]):
    """Guess the fruit (drawn from `seed`) within `attempts` guesses: reward 1 and done for the
    right one; a wrong one gets the fruit's first letter, and the last wrong one ends the
    episode with reward 0."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, attempts: int = 3):
        super().__init__()
        self.attempts = attempts
        self._state = State(step_count=0)
        self._fruit = FRUITS[0]

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> GuessObservation:
        self._fruit = random.Random(seed).choice(FRUITS)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(
            feedback=f"Guess my fruit: one of {', '.join(FRUITS)}.", attempts_left=self.attempts
        )

    def step(
        self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any
    ) -> GuessObservation:
        if action.guess == CRASH:
            raise RuntimeError("the test env fails on purpose")
        self._state.step_count += 1
        left = self.attempts - self._state.step_count
        if action.guess.strip() == self._fruit:
            return GuessObservation(feedback="yes", attempts_left=left, reward=1.0, done=True)
        feedback = f"no; it starts with '{self._fruit[0]}'"
        return GuessObservation(feedback=feedback, attempts_left=left, reward=0.0, done=left <= 0)

    @property
    def state(self) -> State:
        return self._state


class GuessFruitClient(EnvClient[GuessAction, GuessObservation, State]):
    """The env's typed client, as an OpenEnv env package ships one."""

    def _step_payload(self, action: GuessAction) -> dict[str, Any]:
        return {"guess": action.guess}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[GuessObservation]:
        observation = GuessObservation(
            **payload.get("observation", {}),
            reward=payload.get("reward"),
            done=payload.get("done", False),
        )
        return StepResult(observation, payload.get("reward"), payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


class NumberAction(Action):
    """An action without a str field: no message fits it."""

    value: int = 0


class ShortAction(Action):
    """The env's action with room for 8 characters: a longer message is refused."""

    guess: str = Field(max_length=8)


class SignedAction(Action):
    """An action that needs a second field besides the message."""

    guess: str
    player: int


def make_app() -> FastAPI:
    """The env served by OpenEnv's own app, allowing `$OPENENV_TEST_SESSIONS` (default 8)
    concurrent sessions."""
    return create_app(
        GuessFruitEnvironment,
        GuessAction,
        GuessObservation,
        max_concurrent_envs=int(os.environ.get(SESSIONS_VARIABLE, "8")),
    )
