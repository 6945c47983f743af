"""A user's own text task by import path (`env.id: package.module:Class`): made with
`env.kwargs`, driven by a scripted policy that wins and one that loses, chat-message prompts,
every bad class a start-up error naming `env.id`, and a one-process training run on it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agentenv_jax.config.schema import EnvConfig
from agentenv_jax.envs.factory import make_vector_env
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text import BYTE_TOKENIZER, is_text_env, make_text_vector_env

from conftest import byte_messages, train_in_folder

TASKS = "text_tasks_for_tests"


def test_a_users_multi_turn_task_wins_with_binary_search_and_loses_otherwise():
    assert is_text_env(f"{TASKS}:GuessDigit")
    env = make_vector_env(
        EnvConfig(
            id=f"{TASKS}:GuessDigit", kwargs={"top": 3, "context_length": 64, "response_length": 4}
        ),
        4,
    )
    env.reset(seed=0)
    targets = [task.target for task in env._tasks]
    # Binary search over 0..3: guess 1, then 2 or 0, then 3: solved within 3 turns.
    low, high = np.zeros(4, int), np.full(4, 3)
    returns = np.zeros(4)
    ended = np.zeros(4, bool)
    for _ in range(3):
        guesses = (low + high) // 2
        _, rewards, terminated, truncated, _ = env.step(byte_messages([str(g) for g in guesses], 4))
        returns += np.where(ended, 0.0, rewards)
        for i, g in enumerate(guesses):
            if g < targets[i]:
                low[i] = g + 1
            else:
                high[i] = g - 1 if g > targets[i] else g
        ended |= terminated | truncated
    assert ended.all() and returns.tolist() == [1.0] * 4
    # Always "x": three "lower" replies, truncated at max_turns with nothing earned.
    env.reset(seed=1)
    for _ in range(3):
        _, rewards, terminated, truncated, _ = env.step(byte_messages(["x"] * 4, 4))
        assert not rewards.any() and not terminated.any()
    assert truncated.all()
    assert "agent: x\nenv: lower" in env.finished_transcripts[-1][0]


def test_a_task_may_start_with_chat_messages():
    env = make_text_vector_env(
        f"{TASKS}:SystemPromptTask", 2, {"context_length": 32, "response_length": 4}
    )
    obs, _ = env.reset(seed=0)
    # Bytes render the messages' contents one after another.
    assert BYTE_TOKENIZER.decode(obs[0][obs[0] != BYTE_TOKENIZER.pad_id][1:]) == (
        "Answer yes.\n\nReady?"
    )
    _, rewards, *_ = env.step(byte_messages(["yes", "no"], 4))
    assert rewards.tolist() == [1.0, 0.0]


def test_under_a_group_baseline_a_multi_turn_tasks_envs_run_in_rounds():
    """Episodes of all envs start together every max_turns steps; an env whose episode ended
    waits (its steps not acted: padding) until the round ends, and a group shares prompts."""
    env = make_text_vector_env(
        f"{TASKS}:GuessDigit",
        4,
        {"top": 9, "group_size": 2, "context_length": 64, "response_length": 4},
        episode_groups=True,
    )
    assert env.text_spec.episode_round == 3
    env.reset(seed=0)
    targets = [task.target for task in env._tasks]
    assert targets[0] == targets[1] and targets[2] == targets[3]
    wrong = [str((t + 1) % 10) for t in targets]
    _, rewards, terminated, truncated, info = env.step(
        byte_messages([str(targets[0])] + wrong[1:], 4)
    )
    assert rewards.tolist() == [1, 0, 0, 0] and terminated.tolist() == [1, 0, 0, 0]
    assert info["agent_acted"].all()
    # Env 0 waits: its message is ignored, and it is not reset yet.
    _, rewards, terminated, truncated, info = env.step(
        byte_messages([str(targets[0]), str(targets[1]), wrong[2], wrong[3]], 4)
    )
    assert info["agent_acted"].tolist() == [0, 1, 1, 1]
    assert rewards.tolist() == [0, 1, 0, 0] and terminated.tolist() == [0, 1, 0, 0]
    # The round's last step: envs 2, 3 truncated at 3 turns; then all start a new round.
    _, rewards, terminated, truncated, info = env.step(byte_messages(["x"] * 4, 4))
    assert info["agent_acted"].tolist() == [0, 0, 1, 1]
    assert truncated.tolist() == [0, 0, 1, 1] and not terminated.any()
    assert [len(turns) for turns in env._turns] == [0] * 4
    new_targets = [task.target for task in env._tasks]
    assert new_targets[0] == new_targets[1] and new_targets[2] == new_targets[3]
    _, _, _, _, info = env.step(byte_messages(["x"] * 4, 4))
    assert info["agent_acted"].all()


@pytest.mark.slow
def test_a_multi_turn_task_trains_with_a_group_baseline_and_reconciles(tmp_path):
    """GRPO across turns in one process: rounds of 3 messages, waiting steps left out of the
    accounting of messages, tokens and episodes."""
    config = {
        "env": {
            "id": f"{TASKS}:GuessDigit",
            "kwargs": {"top": 3, "context_length": 48, "response_length": 2},
            "global_num_envs": 8,
        },
        "algorithm": {
            "name": "ppo",
            "advantage": "group",
            "group_size": 4,
            "rollout_length": 6,
            "num_minibatches": 1,
        },
        "network": {"language_model": {"size": "tiny"}},
        "run": {"total_env_steps": 96},
    }
    _, run = train_in_folder(tmp_path, config)
    summary = json.loads((run / "summary.json").read_text())
    for accounting in ("accounting", "token_accounting", "episode_accounting"):
        assert summary[accounting]["reconciles"], summary[accounting]
    # Waiting steps are padding: fewer messages trained than steps taken, and every episode
    # (at most 3 messages) of every round ended: 2 rounds a segment, 8 envs.
    steps_taken = summary["updates"] * 6 * 8  # rollout_length x envs
    assert 0 < summary["accounting"]["trained"] < steps_taken
    assert summary["episode_accounting"]["trained"] == 8 * 2 * summary["updates"]


@pytest.mark.parametrize(
    ("env_id", "kwargs", "message"),
    [
        (f"{TASKS}:ResetOnly", {}, r"expected a gymnasium\.Env, or a text task class .*reply"),
        (f"{TASKS}:NoMaxTurns", {}, r"the task's max_turns is None; a text task sets max_turns"),
        (f"{TASKS}:GuessDigit", {"top": -1}, r"making the task .*ValueError: top must be >= 0"),
        (f"{TASKS}:GuessDigit", {"tops": 3}, r"env\.kwargs\.tops is not a kwarg .*'top'"),
        ("no_such_package_xyz.tasks:Task", {}, r"cannot import module 'no_such_package_xyz"),
    ],
)
def test_bad_task_classes_are_start_up_errors_naming_the_env_id(env_id, kwargs, message):
    with pytest.raises(EnvError, match=message):
        env = make_vector_env(EnvConfig(id=env_id, kwargs=kwargs), 2)
        env.reset(seed=0)


@pytest.mark.slow
def test_a_users_task_trains_in_one_process(tmp_path):
    config = {
        "env": {
            "id": f"{TASKS}:GuessDigit",
            "kwargs": {"top": 3, "context_length": 48, "response_length": 2},
            "global_num_envs": 8,
        },
        "algorithm": {"name": "ppo", "rollout_length": 4, "num_minibatches": 1},
        "network": {"language_model": {"size": "tiny"}},
        "run": {"total_env_steps": 64},
    }
    _, run = train_in_folder(tmp_path, config)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] == 2
    for accounting in ("accounting", "token_accounting", "episode_accounting"):
        assert summary[accounting]["reconciles"], summary[accounting]
    assert summary["episode_accounting"]["trained"] > 0  # episodes of up to 3 turns ended
