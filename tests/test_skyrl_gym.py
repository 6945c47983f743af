"""skyrl-gym's own envs as text envs (`skyrl_gym/<env>`), unchanged: `gsm8k` (one turn) and
`gsm8k_multi_turn` (per-turn rewards, up to 5 turns) over rows in SkyRL's dataset layout, each
driven by a scripted policy that wins and one that loses; bad ids and rows refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.envs.text import is_text_env, make_text_vector_env

from conftest import byte_messages, require_reference

require_reference("skyrl_gym")


def write_rows(path, env_class=None):
    """Rows as SkyRL's gsm8k preprocessing writes them (prompt messages, env_class,
    reward_spec with the ground truth, extra_info)."""
    rows = []
    for n in range(6):
        row = {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"Double {n}. End with '#### <answer>'."}],
            "reward_spec": {"method": "rule", "ground_truth": str(2 * n)},
            "extra_info": {"index": n},
        }
        if env_class:
            row["env_class"] = env_class
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def answers(env, right: bool) -> list[str]:
    out = []
    for task in env._tasks:
        n = int(task.env.ground_truth) + (0 if right else 1)
        out.append(f"so #### {n}")
    return out


def test_skyrl_gym_gsm8k_scores_a_right_and_a_wrong_answer(tmp_path):
    assert is_text_env("skyrl_gym/gsm8k")
    kwargs = {"path": str(write_rows(tmp_path / "rows.jsonl")), "test_fraction": 0.0}
    env = make_text_vector_env(
        "skyrl_gym/gsm8k", 4, kwargs | {"context_length": 96, "response_length": 16}
    )
    obs, _ = env.reset(seed=0)
    assert env.max_turns == 1
    _, rewards, terminated, _, info = env.step(byte_messages(answers(env, right=True)))
    assert rewards.tolist() == [1.0] * 4 and terminated.all() and info["success"].all()
    _, rewards, terminated, _, info = env.step(byte_messages(answers(env, right=False)))
    assert rewards.tolist() == [0.0] * 4 and terminated.all() and not info["success"].any()


def test_skyrl_gym_multi_turn_gsm8k_gives_per_turn_rewards_and_its_own_turns(tmp_path):
    kwargs = {
        "path": str(write_rows(tmp_path / "rows.jsonl", env_class="gsm8k_multi_turn")),
        "test_fraction": 0.0,
        "context_length": 512,
        "response_length": 16,
    }
    env = make_text_vector_env("skyrl_gym/gsm8k", 2, kwargs)
    env.reset(seed=0)
    assert env.max_turns == 5  # the env's own default, from the row's env_class
    # Two well-formatted wrong answers (0.2 / 5 each), then the right one (1.0).
    for turn in range(3):
        _, rewards, terminated, truncated, _ = env.step(
            byte_messages(answers(env, right=turn == 2))
        )
        if turn < 2:
            assert np.allclose(rewards, 0.04) and not terminated.any()
    assert rewards.tolist() == [1.0, 1.0] and terminated.all()
    assert "env: Please provide your step-by-step reasoning" in env.finished_transcripts[-1][0]
    # Never right: truncated by the env itself at its 5 turns, with no success.
    for _ in range(5):
        _, rewards, terminated, truncated, info = env.step(byte_messages(["no answer"] * 2))
    assert terminated.all() and not info["success"].any() and not rewards.any()


@pytest.mark.parametrize(
    ("env_id", "rows_class", "message"),
    [
        ("skyrl_gym/gsm8", None, r"env\.id = 'gsm8': no skyrl-gym env .*did you mean 'gsm8k'"),
        ("skyrl_gym/gsm8k", "nope", r"row 0's env_class = 'nope': no skyrl-gym env"),
    ],
)
def test_bad_skyrl_gym_ids_and_rows_are_named(tmp_path, env_id, rows_class, message):
    path = write_rows(tmp_path / "rows.jsonl", env_class=rows_class)
    with pytest.raises(EnvError, match=message):
        make_text_vector_env(env_id, 2, {"path": str(path), "test_fraction": 0.0})


def test_a_row_the_env_refuses_is_named(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "?"}]}) + "\n")
    with pytest.raises(EnvError, match=r"row 0 does not make skyrl-gym env 'gsm8k': Assertion"):
        make_text_vector_env("skyrl_gym/gsm8k", 2, {"path": str(path), "test_fraction": 0.0})
