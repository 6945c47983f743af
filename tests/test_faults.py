"""Env faults: re-created and counted by default, or fatal with `env.on_fault: fail`."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from agentenv_jax.config import load_config
from agentenv_jax.envs.faults import FaultInjectingEnv, RecreateOnFault, fault_mask, faulty_env
from agentenv_jax.runtime.launch import train

from conftest import EXPERIMENTS

CARTPOLE = EXPERIMENTS / "cartpole_ppo.yaml"
FAULTY = ["env.id=agentenv_jax.envs.faults:faulty_env"]


def test_fault_injector_rate_is_per_episode_and_repeatable():
    def faults_in(seed):
        FaultInjectingEnv._instances = 0
        env = FaultInjectingEnv(gym.make("CartPole-v1"), rate=0.3, seed=seed, horizon=5)
        faults = []
        for episode in range(200):
            env.reset(seed=episode)
            try:
                for _ in range(5):
                    env.step(0)
            except RuntimeError:
                faults.append(episode)
        return faults

    first = faults_in(1)
    assert first == faults_in(1)
    assert 0.2 < len(first) / 200 < 0.4


def test_recreate_on_fault_reports_a_flagged_truncation():
    made = []

    def make():
        made.append(FaultInjectingEnv(gym.make("CartPole-v1"), rate=1.0, horizon=1))
        return made[-1]

    vector = gym.vector.SyncVectorEnv(
        [lambda: RecreateOnFault.around(make)] * 2,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    vector.reset(seed=0)
    _, reward, terminated, truncated, info = vector.step(np.zeros(2, int))
    assert truncated.all() and not terminated.any() and (reward == 0).all()
    assert fault_mask(info, 2).all()
    assert len(made) >= 4  # both envs were made anew


@pytest.mark.slow
def test_training_survives_a_one_percent_fault_rate(run_dir):
    config = load_config(
        CARTPOLE,
        [
            *FAULTY,
            "env.kwargs={env_id: CartPole-v1, rate: 0.01}",
            f"run.run_dir={run_dir}",
            "run.stop_at_return=475",
            "run.progress=false",
        ],
    )
    result = train(config)
    assert result.episode_return_mean >= 475 and result.env_steps <= 100_000
    assert result.accounting["reconciles"]
    summary = (result.run_dir / "summary.json").read_text()
    assert '"env_faults": 0' not in summary and '"env_faults"' in summary


@pytest.mark.slow
def test_fail_fast_policy_stops_at_the_first_fault(run_dir):
    config = load_config(
        CARTPOLE,
        [
            *FAULTY,
            "env.kwargs={env_id: CartPole-v1, rate: 1.0}",
            "env.on_fault=fail",
            f"run.run_dir={run_dir}",
            "run.progress=false",
        ],
    )
    with pytest.raises(RuntimeError, match="injected env fault"):
        train(config)


@pytest.mark.slow
def test_replay_partition_drops_the_n_step_window_of_a_faulted_episode(run_dir):
    config = load_config(
        EXPERIMENTS / "pendulum_sac.yaml",
        [
            "env.id=agentenv_jax.envs.faults:faulty_env",
            "env.kwargs={env_id: Pendulum-v1, rate: 0.5, horizon: 50}",
            "algorithm.n_step=3",
            "algorithm.learning_starts=64",
            "run.total_env_steps=800",
            "algorithm.log_interval=10",
            f"run.run_dir={run_dir}",
            "run.progress=false",
        ],
    )
    result = train(config)
    assert result.accounting["reconciles"], result.accounting
    assert result.accounting["dropped"] > 0


@pytest.mark.parametrize(
    "make_env",
    [
        lambda: faulty_env(),
        lambda: faulty_env(env_id="Pendulum-v1"),
        lambda: RecreateOnFault.around(lambda: gym.make("CartPole-v1")),
        # Every episode faults (and its env is made anew) within the checker's few steps.
        lambda: RecreateOnFault.around(lambda: faulty_env(rate=1.0, horizon=2)),
    ],
    ids=["faulty_env", "faulty_env_pendulum", "recreate", "recreate_faulty_every_episode"],
)
def test_shipped_envs_and_wrappers_pass_gymnasiums_env_checker(make_env):
    """Gymnasium's own checker: spaces, seeding, determinism of a seeded step (faults and the
    envs that replace faulted ones included), and re-creation from the env's spec. The render
    check is skipped: CartPole's render modes need pygame, which is not a dependency."""
    check_env(make_env(), skip_render_check=True)


def test_envs_made_anew_after_faults_repeat_with_the_seed():
    """A seeded run repeats its faults and the episodes of the envs that replace faulted ones."""

    def observations(seed):
        env = RecreateOnFault.around(lambda: faulty_env(rate=1.0, horizon=3))
        seen = [env.reset(seed=seed)[0]]
        for _ in range(30):
            seen.append(env.step(0)[0])
        return np.array(seen)

    np.testing.assert_array_equal(observations(5), observations(5))
