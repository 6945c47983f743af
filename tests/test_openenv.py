"""OpenEnv environments as text tasks (`OpenEnvTask`), with real OpenEnv and nothing mocked: a
guessing game (tests/openenv_envs_for_tests.py) won by a scripted policy that reads the hints and
lost by one that never does, in process and served by OpenEnv's own server through its generic
and typed clients; failures mid-episode counted and ended with `reward_on_error`; a server
down, at capacity or killed, and bad configurations, each an `EnvError` naming the kwarg."""

from __future__ import annotations

import copy
import math
import re
import socket
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text import BYTE_TOKENIZER
from agentenv_jax.envs.text.vector_env import TextVectorEnv

from conftest import byte_messages, kill_job, require_reference, start_job

require_reference("openenv")
from openenv_envs_for_tests import CRASH, SESSIONS_VARIABLE  # noqa: E402

from agentenv_jax.envs.text.openenv_tasks import OpenEnvTask  # noqa: E402

MODULE = "openenv_envs_for_tests"
TARGET = f"{MODULE}:GuessFruitEnvironment"
RESPONSE_LENGTH = 16


def dialogue(obs: np.ndarray) -> str:
    """An observation's text, its turns (each ended by EOS) on lines of their own."""
    turns = np.split(obs, np.flatnonzero(obs == BYTE_TOKENIZER.eos_id) + 1)
    return "\n".join(BYTE_TOKENIZER.decode(turn) for turn in turns)


def reads_hints(text: str) -> str:
    """Wins: the first fruit, then the one the last hint's first letter names."""
    letters = re.findall(r"starts with '(\w)'", text)
    fruits = re.search(r"one of ([\w, ]+)\.", text).group(1).split(", ")
    return next(f for f in fruits if f[0] == letters[-1]) if letters else fruits[0]


def never_learns(text: str) -> str:
    return "kiwi"


def play(
    task: OpenEnvTask, policy: Callable[[str], str], num_envs: int = 3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, TextVectorEnv]:
    """One episode in each of `num_envs` envs (copies of `task`) driven by `policy` through
    `TextVectorEnv` in bytes: each env's return, success and turns, and the env, its tasks
    closed."""
    env = TextVectorEnv(
        lambda: copy.copy(task),
        num_envs,
        context_length=256,
        response_length=RESPONSE_LENGTH,
        tokenizer=BYTE_TOKENIZER,
    )
    try:
        obs, _ = env.reset(seed=seed)
        returns = np.zeros(num_envs)
        success = np.zeros(num_envs, bool)
        turns = np.zeros(num_envs, int)
        ended = np.zeros(num_envs, bool)
        for _ in range(task.max_turns):
            texts = [policy(dialogue(o)) for o in obs]
            obs, rewards, terminated, truncated, info = env.step(
                byte_messages(texts, RESPONSE_LENGTH)
            )
            assert info["reward_failed"].sum() == 0
            returns += np.where(ended, 0.0, rewards)
            turns += ~ended
            success |= info["success"] & ~ended
            ended |= terminated | truncated
            if ended.all():
                break
        assert ended.all()
    finally:
        for copied in env._tasks:
            copied.close()
    return returns, success, turns, env


def test_an_openenv_environment_in_process_is_won_by_reading_hints_and_lost_otherwise():
    task = OpenEnvTask(target=TARGET, env_kwargs={"attempts": 3}, max_turns=4)
    assert (task.message_field, task.observation_field) == ("guess", "feedback")
    returns, success, turns, env = play(task, reads_hints)
    assert returns.tolist() == [1.0] * 3 and success.all() and (turns <= 2).all()
    # The envs' seeds draw apple, lemon, lemon: one guess, then two.
    assert turns.tolist() == [1, 2, 2]
    transcript = env.finished_transcripts[-1][0]
    assert transcript.startswith("Guess my fruit: one of apple, grape, lemon.\nagent: apple")
    # Each copy made its own env at its reset, and `close` ends it; the task itself made none.
    env.reset(seed=0)
    assert task._env is None and len({id(t._env) for t in env._tasks}) == 3
    for copied in env._tasks:
        copied.close()
    assert all(t._env is None for t in env._tasks)
    # A copy of a task that holds an env starts without it.
    task.reset(np.random.default_rng(0))
    assert task._env is not None and copy.copy(task)._env is None
    task.close()

    returns, success, turns, _ = play(task, never_learns)
    assert returns.tolist() == [0.0] * 3 and not success.any() and turns.tolist() == [3] * 3
    # Cut by max_turns before the env ends it: truncated, not won.
    returns, success, turns, _ = play(OpenEnvTask(target=TARGET, max_turns=2), never_learns)
    assert not success.any() and turns.tolist() == [2] * 3


def test_a_message_the_action_class_refuses_ends_the_episode_and_is_counted(capfd):
    task = copy.copy(
        OpenEnvTask(target=TARGET, action_class=f"{MODULE}:ShortAction", reward_on_error=-1.0)
    )
    task.reset(np.random.default_rng(0))
    reply = task.reply("a guess longer than eight bytes")
    assert (reply.reward, reply.done, reply.success) == (-1.0, True, False)
    assert reply.failed == (True,) and math.isnan(reply.terms[0]) and task.failures == 1
    assert "refused a message as its action" in capfd.readouterr().err
    task.reset(np.random.default_rng(0))
    assert task.reply("apple").reward == 1.0 and task.failures == 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(sessions: int) -> tuple[object, str]:
    """The test env served by OpenEnv's `create_app` under uvicorn on a free local port, once
    it answers; the process and its URL. (Uvicorn logs only critical messages: OpenEnv's
    server logs a traceback each time a client closes its session.)"""
    port = free_port()
    proc = start_job(
        [sys.executable, "-m", "uvicorn", "--factory", f"{MODULE}:make_app"]
        + ["--host", "127.0.0.1", "--port", str(port), "--log-level", "critical"],
        extra_env={SESSIONS_VARIABLE: str(sessions)},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                kill_job(proc)
                pytest.fail(f"the OpenEnv server did not start:\n{proc.communicate()[1][-3000:]}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc, url = start_server(sessions=8)
    yield url
    kill_job(proc)


@pytest.mark.slow
@pytest.mark.parametrize("client", [None, f"{MODULE}:GuessFruitClient"])
def test_the_environment_served_by_openenv_is_won_and_lost_through_its_client(server, client):
    # The generic client reads the fields from the server's /schema, the typed one from its
    # classes.
    task = OpenEnvTask(base_url=server, client=client)
    assert (task.message_field, task.observation_field) == ("guess", "feedback")
    returns, success, turns, _ = play(task, reads_hints)
    assert returns.tolist() == [1.0] * 3 and success.all() and turns.tolist() == [1, 2, 2]
    # The env ends the episode after its 3 attempts, before max_turns (8).
    returns, success, turns, _ = play(task, never_learns)
    assert returns.tolist() == [0.0] * 3 and not success.any() and turns.tolist() == [3] * 3


@pytest.mark.slow
def test_a_url_that_is_not_an_openenv_server_is_an_env_error_with_the_http_status(server):
    with pytest.raises(EnvError, match=r"GET .*/nope/schema answered HTTP 404 \(Not Found\)"):
        OpenEnvTask(base_url=f"{server}/nope")


@pytest.mark.slow
def test_a_server_error_mid_episode_ends_it_with_reward_on_error_and_is_counted(server, capfd):
    task = OpenEnvTask(base_url=server, reward_on_error=-1.0)
    env = TextVectorEnv(
        lambda: copy.copy(task), 2, context_length=256, response_length=RESPONSE_LENGTH
    )
    try:
        env.reset(seed=0)
        # The env raises on CRASH: OpenEnv's server answers an EXECUTION_ERROR message.
        _, rewards, terminated, truncated, info = env.step(
            byte_messages([CRASH, "kiwi"], RESPONSE_LENGTH)
        )
        assert rewards.tolist() == [-1.0, 0.0] and terminated.tolist() == [True, False]
        assert info["reward_failed"].tolist() == [[True], [False]]
        assert [t.failures for t in env._tasks] == [1, 0]
        err = capfd.readouterr().err
        assert f"the OpenEnv env {server} failed a step" in err and "EXECUTION_ERROR" in err
        # Env 0 went on to a new session and episode: seed 0 draws apple.
        _, rewards, terminated, *_ = env.step(byte_messages(["apple", "kiwi"], RESPONSE_LENGTH))
        assert rewards.tolist() == [1.0, 0.0] and terminated.tolist() == [True, False]
        assert [t.failures for t in env._tasks] == [1, 0]
    finally:
        for copied in env._tasks:
            copied.close()


@pytest.mark.slow
def test_a_server_at_capacity_or_killed_is_an_env_error_naming_its_url(capfd):
    proc, url = start_server(sessions=1)
    try:
        task = OpenEnvTask(base_url=url)
        first, second = copy.copy(task), copy.copy(task)
        first.reset(np.random.default_rng(0))
        with pytest.raises(
            EnvError, match=r"(CAPACITY_REACHED|closed the new session).*max_concurrent_envs=N"
        ):
            second.reset(np.random.default_rng(0))
        # Killed mid-episode: the step fails and is counted, and the next reset cannot start.
        kill_job(proc)
        reply = first.reply("kiwi")
        assert (reply.reward, reply.done, reply.failed, first.failures) == (0.0, True, (True,), 1)
        with pytest.raises(EnvError, match=rf"base_url = '{url}': .*did not start an episode"):
            first.reset(np.random.default_rng(0))
    finally:
        kill_job(proc)


def test_a_server_that_is_down_is_an_env_error_naming_its_url():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(EnvError, match=rf"base_url = '{url}': cannot reach the OpenEnv server"):
        OpenEnvTask(base_url=url)
    # With the classes known here (target), nothing is asked of it until the first reset.
    task = copy.copy(OpenEnvTask(base_url=url, target=TARGET))
    with pytest.raises(
        EnvError, match=rf"base_url = '{url}': .*ConnectionError: Failed to connect"
    ):
        task.reset(np.random.default_rng(0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, r"env\.kwargs\.target and env\.kwargs\.base_url are both unset"),
        ({"target": "no_such_module_xyz:Env"}, r"target = .*cannot import module 'no_such_mod"),
        ({"target": f"{MODULE}:NoSuchEnv"}, rf"target = .*module '{MODULE}' has no 'NoSuchEnv'"),
        ({"target": f"{MODULE}:GuessAction"}, r"target = .* is not an openenv Environment"),
        ({"target": "GuessFruitEnvironment"}, r"target = .*expected .* package\.module:name"),
        (
            {"target": TARGET, "action_class": f"{MODULE}:NumberAction"},
            r"message_field is not set and the action class .*NumberAction has 0 str fields",
        ),
        (
            {"target": TARGET, "message_field": "answer"},
            r"message_field = 'answer': the action class .*GuessAction has no such field; "
            r"its fields: guess",
        ),
        (
            {"target": TARGET, "action_class": f"{MODULE}:SignedAction"},
            r"message_field = 'guess': .*SignedAction also requires player",
        ),
        (
            {"target": TARGET, "observation_field": "hint"},
            r"observation_field = 'hint': .*GuessObservation has no such field; its fields: "
            r"feedback, attempts_left",
        ),
        ({"target": TARGET, "env_kwargs": {"tries": 3}}, r"env_kwargs = .*does not take them"),
        ({"target": TARGET, "max_turns": 0}, r"max_turns = 0: expected an int >= 1"),
        ({"base_url": "127.0.0.1:8000"}, r"base_url = '127\.0\.0\.1:8000': expected .*http://"),
        (
            {"target": TARGET, "client": f"{MODULE}:GuessFruitClient"},
            r"client = .*needs env\.kwargs\.base_url",
        ),
    ],
)
def test_bad_configurations_are_env_errors_naming_the_kwarg(kwargs, message):
    with pytest.raises(EnvError, match=message):
        OpenEnvTask(**kwargs)


def _sum_of(text: str) -> int:
    """The right answer to the last question in `text`."""
    a, b = re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1]
    return int(a) + int(b)


@pytest.mark.parametrize(
    "policy, expected_return, expected_turns",
    [
        (lambda text: f"It is {_sum_of(text)}", 1.0, 1),
        # Right at the second attempt only: half the reward.
        (lambda text: str(_sum_of(text) + ("Try again" not in text)), 0.5, 2),
        (lambda text: "I do not know", 0.0, 2),
    ],
    ids=["right", "right_when_asked_again", "wrong"],
)
def test_the_shipped_sums_environment_rewards_a_right_first_answer_over_a_retry(
    policy, expected_return, expected_turns
):
    """`openenv_sums_smollm2`'s env (`agentenv_jax.envs.text.openenv_sums`), as it trains."""
    task = OpenEnvTask(target="agentenv_jax.envs.text.openenv_sums:SumsEnvironment", max_turns=2)
    returns, success, turns, env = play(task, policy, num_envs=4)
    assert returns.tolist() == [expected_return] * 4
    assert success.tolist() == [expected_return == 1.0] * 4
    assert turns.tolist() == [expected_turns] * 4
    # Groups of one env each: four seeds, four questions of two one-digit numbers.
    questions = {t.splitlines()[0] for t, _, _ in env.finished_transcripts}
    assert len(questions) == 4 and all(re.fullmatch(r"What is \d \+ \d\? .*", q) for q in questions)
