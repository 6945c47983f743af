"""The Atari pipeline on its C++ vector envs (`envs.atari`): against Gymnasium's own
`AtariPreprocessing` + `FrameStackObservation` on the same ROM, seed and actions; the training
signals (clipped rewards, lost lives) beside the game's score; bad input; and short training
jobs under `mpiexec -n 3` on each backend with exact accounting."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import load_config
from agentenv_jax.envs.atari import (
    EPISODE_SCORE,
    GAME_OVER,
    AtariSettings,
    AtariVectorEnv,
    atari_game,
    atari_settings,
    human_normalized_score,
    make_atari_vector_env,
)
from agentenv_jax.envs.spaces import EnvError

from conftest import REPO, agentenv_command, mpi_launch, run_command, settings

BACKENDS = ("ale", "envpool")
GAME_OF = {"pong_ppo": "ALE/Pong-v5", "breakout_impala": "ALE/Breakout-v5"}
# The reference's settings, which both sides are given: no no-op starts, no sticky actions, no
# FIRE after reset (Gymnasium's wrappers have none of the three), the game's own signals.
PLAIN = AtariSettings(noop_max=0, episodic_life=False, reward_clipping=False, use_fire_reset=False)


def _reference(game_id: str, seed: int):
    import ale_py
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    env = gym.make(game_id, frameskip=1, repeat_action_probability=0.0)
    env = AtariPreprocessing(
        env, noop_max=0, frame_skip=4, screen_size=84, terminal_on_life_loss=False
    )
    env = FrameStackObservation(env, 4)
    env.reset(seed=seed)
    return env


def _play(game: str, game_id: str, backend: str, steps: int, actions: int):
    """Both pipelines stepped with one fixed action sequence: per step, the fraction of pixels
    that differ, and whether rewards, lives and terminations agree."""
    reference = _reference(game_id, seed=3)
    ours = AtariVectorEnv(game, backend, 1, PLAIN, frame_stack=4, num_threads=1)
    ours.reset(seed=3)
    rng = np.random.default_rng(0)
    differing, same_signals = [], []
    try:
        for _ in range(steps):
            action = int(rng.integers(0, actions))
            frames, reward, terminated, _, info = reference.step(action)
            obs, _, our_terminated, _, our_info = ours.step(np.array([action]))
            assert obs.shape == (1, 84, 84, 4) and obs.dtype == np.uint8
            differing.append(np.mean(obs[0].transpose(2, 0, 1) != frames))
            same_signals.append(
                reward == our_info[EPISODE_SCORE][0]
                and info["lives"] == our_info["lives"][0]
                and terminated == our_terminated[0]
            )
            if terminated:
                break
    finally:
        reference.close()
        ours.close()
    return np.array(differing), np.array(same_signals), terminated


def test_ale_backend_plays_a_whole_game_as_gymnasiums_wrappers_do():
    """A Breakout game to its end: every reward, life count and the final termination are the
    reference's; the frames differ in under 0.5% of pixels, never in more than 1% on one step
    once the stack holds 4 frames of the game. Stated differences: rounding where the two
    resize and max-pool the 210x160 screen, and what fills the stack before then."""
    differing, same_signals, ended = _play("breakout", "ALE/Breakout-v5", "ale", 2000, 4)
    assert ended and len(differing) > 100  # random play loses 5 lives in ~180 steps
    assert same_signals.all(), np.flatnonzero(~same_signals)[:10]
    assert differing.mean() < 0.005, differing.mean()
    assert differing[3:].max() < 0.01, differing[3:].max()


def test_envpool_backend_starts_as_gymnasiums_wrappers_and_then_drifts():
    """EnvPool bundles an ALE build of its own: Pong's first 200 steps score and look as the
    reference does (frames within 1.5% of pixels), and the games drift apart later (stated
    difference, docs/atari.md)."""
    differing, same_signals, _ = _play("pong", "ALE/Pong-v5", "envpool", 200, 6)
    assert same_signals.all(), np.flatnonzero(~same_signals)[:10]
    assert differing.mean() < 0.015, differing.mean()


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_signals_are_clipped_and_lives_end_episodes_while_the_score_is_the_games(
    backend,
):
    """Space Invaders scores 5 to 30 a hit: the training reward is its sign, the score is the
    game's. A lost life terminates the training episode and the game goes on (lives keep
    falling) until the last one, the only game over."""
    env = make_atari_vector_env("SpaceInvaders-v5", backend, 4, {}, None, 4, 2)
    env.reset(seed=1)
    rng = np.random.default_rng(1)
    rewards, scores, ends, game_overs, lives = [], [], [], [], []
    for _ in range(1500):
        _, reward, terminated, truncated, info = env.step(rng.integers(0, 6, 4))
        rewards.append(reward)
        scores.append(info[EPISODE_SCORE])
        ends.append(terminated | truncated)
        game_overs.append(info[GAME_OVER])
        lives.append(info["lives"])
    env.close()
    rewards, scores = np.array(rewards), np.array(scores)
    ends, game_overs, lives = np.array(ends), np.array(game_overs), np.array(lives)
    assert set(np.unique(rewards)) <= {0.0, 1.0} and scores.max() >= 5
    np.testing.assert_array_equal(rewards, np.sign(scores))
    assert game_overs.sum() >= 4 and ends.sum() >= 2.5 * game_overs.sum()
    lost_life = ends & ~game_overs
    # A lost life: the game goes on with one life fewer (the next step's lives are not reset).
    t, e = np.nonzero(lost_life[:-1])
    assert (lives[t + 1, e] <= lives[t, e]).all()


def test_human_normalized_scores_run_from_random_play_to_human_play():
    assert human_normalized_score("pong", -20.7) == 0.0
    assert human_normalized_score("pong", 14.6) == pytest.approx(1.0)
    assert human_normalized_score("breakout", 30.5 + 28.8) == pytest.approx(2.0)
    assert np.isnan(human_normalized_score("adventure", 1.0))  # not in the table
    assert np.isnan(human_normalized_score("pong", None))  # no game finished


def test_bad_input_is_one_clear_error(monkeypatch):
    with pytest.raises(
        EnvError, match=r"'ALE/Pongg-v5' is not an Atari game \(did you mean 'Pong'"
    ):
        atari_game("ALE/Pongg-v5")
    assert atari_game("ALE/SpaceInvaders-v5") == atari_game("space_invaders") == "space_invaders"
    with pytest.raises(EnvError, match=r"env.kwargs.sticky is not a setting.*allowed: frameskip"):
        atari_settings({"sticky": 0.25}, None)
    with pytest.raises(EnvError, match=r"repeat_action_probability = 1.5 is not allowed"):
        atari_settings({"repeat_action_probability": 1.5}, None)
    with pytest.raises(EnvError, match=r"env.kwargs.episodic_life = 1 is not allowed: expected"):
        atari_settings({"episodic_life": 1}, None)
    assert atari_settings({}, 1000).max_num_frames_per_episode == 4000
    with pytest.raises(ConfigError, match=r"env.frame_stack = 0 is not allowed"):
        load_config("pong_ppo", ["env.frame_stack=0"])
    with pytest.raises(ConfigError, match=r"env.vectorization = 'sync' is not allowed.*envpool"):
        load_config("pong_ppo", ["env.vectorization=sync"])
    with pytest.raises(ConfigError, match=r"env.vectorization = 'envpool' is not allowed"):
        load_config("cartpole_ppo", ["env.vectorization=envpool"])
    # A backend that is not installed: its import fails as it would without the package.
    monkeypatch.setitem(sys.modules, "envpool", None)
    with pytest.raises(EnvError, match=r"'envpool' needs the 'envpool' package.*pip install"):
        make_atari_vector_env("Pong-v5", "envpool", 2, {}, None, 4, 1)


@pytest.mark.slow
@pytest.mark.parametrize(
    "experiment, backend", [("pong_ppo", "envpool"), ("breakout_impala", "ale")]
)
def test_each_backend_trains_under_mpiexec_with_exact_accounting(run_dir, experiment, backend):
    """1 learner + 2 env ranks, six updates of each shipped Atari experiment on each C++
    backend: the experience reconciles, and the episodes reported are whole games (Breakout's
    five lives take a random policy ~180 steps; one life ~35)."""
    overrides = [
        f"run.run_dir={run_dir}",
        "run.name=atari",
        "run.progress=false",
        f"env.vectorization={backend}",
        "env.global_num_envs=4",
        "env.num_threads=1",
        "algorithm.rollout_length=64",
        "run.total_env_steps=1536",
    ]
    if experiment == "pong_ppo":
        overrides += ["algorithm.num_epochs=1", "algorithm.num_minibatches=2"]
    proc = run_command(
        [*mpi_launch(3), *agentenv_command("train", experiment, *settings(*overrides))],
        timeout=400,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((run_dir / "atari" / "summary.json").read_text())
    accounting = summary["accounting"]
    # (IMPALA's env ranks run ahead: segments past max_policy_lag arrive late, counted apart.)
    assert accounting["reconciles"] and accounting["unsent"] == 0, accounting
    assert accounting["trained"] == summary["env_steps"] >= 1024, accounting
    assert summary["topology"].startswith("1 learner + 2 env rank(s), 4 envs")
    assert summary["human_normalized_score"] == pytest.approx(
        human_normalized_score(atari_game(GAME_OF[experiment]), summary["episode_return_mean"]),
        nan_ok=True,
    )
    if experiment == "breakout_impala":
        lengths = [json.loads(line) for line in (run_dir / "atari" / "metrics.jsonl").open()]
        lengths = [m["episode_length_mean"] for m in lengths if m.get("episode_length_mean")]
        assert lengths and min(lengths) > 100, lengths
