"""The Atari pipeline on its C++ vector envs (`envs.atari`): against Gymnasium's own
`AtariPreprocessing` + `FrameStackObservation` on the same ROM, seed and actions; the training
signals (clipped rewards, lost lives) beside the game's score; bad input; and short training
jobs under `mpiexec -n 3` on each backend with exact accounting."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest

from agentenv_jax.actor.loop import Actor
from agentenv_jax.buffers.frame_stacks import restack
from agentenv_jax.buffers.segment_queue import on_policy_segment_spec
from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import load_config
from agentenv_jax.envs.atari import (
    EPISODE_SCORE,
    GAME_OVER,
    STACK_RESTART,
    AtariSettings,
    AtariVectorEnv,
    atari_game,
    atari_settings,
    human_normalized_score,
    make_atari_vector_env,
)
from agentenv_jax.envs.factory import vector_env_spaces
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.transport.messages import param_message_spec

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
    """A Breakout game to its end: every frame stack, reward, life count and the final
    termination are the reference's, bit for bit (both pad a new game's stack with its first
    frame)."""
    differing, same_signals, ended = _play("breakout", "ALE/Breakout-v5", "ale", 2000, 4)
    assert ended and len(differing) > 100  # random play loses 5 lives in ~180 steps
    assert same_signals.all(), np.flatnonzero(~same_signals)[:10]
    assert not differing.any(), np.flatnonzero(differing)[:10]


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


def _play_steps(env, steps: int, seed: int, actions: int = 4) -> list:
    """The reset's observations, then each step's outcome, with a fixed action sequence."""
    rng = np.random.default_rng(0)
    played = [env.reset(seed=seed)[0]]
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(rng.integers(0, actions, env.num_envs))
        played.append((obs, reward, terminated, truncated, info[EPISODE_SCORE], info[GAME_OVER]))
    env.close()
    return played


@pytest.mark.parametrize("backend", BACKENDS)
def test_games_in_groups_step_as_one_pool_does(backend):
    """`env.num_splits`: 7 games in 3 groups, each a C++ pool of its own (sent and received
    apart), play the very games of one pool of 7: game j is seeded seed + j in both."""
    one = _play_steps(make_atari_vector_env("Breakout-v5", backend, 7, {}, 60, 4, 2), 300, 10)
    groups = make_atari_vector_env("Breakout-v5", backend, 7, {}, 60, 4, 2, 3)
    assert [(rows.start, rows.stop) for rows in groups.splits] == [(0, 3), (3, 5), (5, 7)]
    split = _play_steps(groups, 300, 10)
    assert any(step[5].any() for step in one[1:])  # games ended (60-step limit) and restarted
    np.testing.assert_array_equal(one[0], split[0])
    for a, b in zip(one[1:], split[1:], strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def test_frame_stacks_are_envpools_own():
    """The stacks built here from EnvPool's single frames are bit for bit the ones EnvPool
    stacks itself (a new game's stack: its first frame 4 times; a lost life goes on)."""
    import envpool

    rng = np.random.default_rng(0)
    theirs = envpool.make(
        "Breakout-v5",
        env_type="gymnasium",
        num_envs=4,
        num_threads=2,
        seed=5,
        stack_num=4,
        episodic_life=True,
        max_episode_steps=100,
    )
    ours = make_atari_vector_env("Breakout-v5", "envpool", 4, {}, 100, 4, 2)
    expected, _ = theirs.reset()
    obs, info = ours.reset(seed=5)
    assert info[STACK_RESTART].all()
    restarts = 0
    for _ in range(600):
        np.testing.assert_array_equal(obs, expected.transpose(0, 2, 3, 1))
        actions = rng.integers(0, 4, 4)
        expected = theirs.step(actions)[0]
        obs, _, _, _, info = ours.step(actions)
        restarts += int(info[STACK_RESTART].sum())
    theirs.close()
    ours.close()
    assert restarts >= 8  # games of 100 steps: each of the 4 restarted


class PixelPolicy:
    """A deterministic stand-in for the env rank's policy: the action, log-probability and
    value are functions of the pixels it is shown."""

    has_params = True
    num_params = 0

    def set_params(self, flat_params: np.ndarray) -> None:
        pass

    def act(self, obs: np.ndarray):
        total = obs.reshape(len(obs), -1).sum(axis=1, dtype=np.int64)
        return (total % 4).astype(np.int32), (total % 7).astype(np.float32), total % 11 / 11.0

    def value(self, obs: np.ndarray) -> np.ndarray:
        return (obs.reshape(len(obs), -1).sum(axis=1, dtype=np.int64) % 5).astype(np.float32)


def _segments(backend: str, splits: int, frames: bool, count: int) -> list[dict]:
    env = make_atari_vector_env("Breakout-v5", backend, 5, {}, 40, 4, 2, splits)
    spaces = vector_env_spaces("Breakout-v5", env)
    assert spaces.stacked_frames == 4
    if not frames:
        spaces = dataclasses.replace(spaces, stacked_frames=0)
    spec = on_policy_segment_spec(spaces, 32, 5)
    param_spec = param_message_spec(0, 0)
    actor = Actor(
        env,
        spaces,
        PixelPolicy(),
        None,
        spec,
        param_spec,
        **dict(seed=2, env_offset=0, rollout_length=32, gamma=0.99, normalize_obs=False)
        | dict(normalize_reward=False, clip_obs=1.0, clip_reward=1.0, max_inflight_segments=1)
        | dict(max_policy_lag=0, timeout_s=10.0),
    )
    actor._load_params(param_spec.allocate())
    segments = []
    for _ in range(count):
        buffer = spec.allocate()
        actor._fill_segment(spec.views(buffer))
        segments.append({k: v.copy() for k, v in spec.views(buffer).items()})
    env.close()
    return segments


@pytest.mark.parametrize("backend", BACKENDS)
def test_frames_sent_once_are_stacked_again_as_the_policy_saw_them(backend):
    """An env rank's segments of Atari frames: sent as one frame per step (in 2 groups of
    games) they are, once stacked again on the learner's side, the very segments sent whole
    (by one pool): every observation, across game restarts (40-step games) and segment
    boundaries, and every other field; about a quarter of the bytes."""
    whole = _segments(backend, splits=1, frames=False, count=4)
    frames = _segments(backend, splits=2, frames=True, count=4)
    restarts = 0
    for a, b in zip(whole, frames, strict=True):
        np.testing.assert_array_equal(
            restack(b["obs_frame"], b["obs_head"], b["obs_restart"]), a["obs"]
        )
        restarts += int(b["obs_restart"].sum())
        for name in set(a) - {"obs", "actor_seconds"}:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert restarts >= 5  # 128 steps of 5 games of 40: a restart of each
    spaces = vector_env_spaces("x", make_atari_vector_env("Pong-v5", backend, 8, {}, None, 4, 1))
    sent = on_policy_segment_spec(spaces, 128, 8).nbytes
    whole_bytes = on_policy_segment_spec(dataclasses.replace(spaces, stacked_frames=0), 128, 8)
    assert 0.25 < sent / whole_bytes.nbytes < 0.27, sent / whole_bytes.nbytes


@pytest.mark.parametrize("frames_once, stacked_frames", [(True, 4), (False, 0)])
def test_env_frames_once_chooses_how_stacks_travel(frames_once, stacked_frames):
    """`env.frames_once` (default true): an env rank's spaces say its stacks travel as frames,
    or whole (`false`: cheaper for a learner on the env ranks' own host, docs/atari.md)."""
    from agentenv_jax.runtime.roles import prepare_env_rank
    from agentenv_jax.transport.topology import make_topology

    config = load_config(
        "pong_ppo", ["env.global_num_envs=2", f"env.frames_once={str(frames_once).lower()}"]
    )
    vector_env, spaces = prepare_env_rank(config, make_topology(config, world_size=1, rank=0))
    vector_env.close()
    assert spaces.stacked_frames == stacked_frames
    names = {field.name for field in on_policy_segment_spec(spaces, 8, 2).fields}
    assert ("obs" in names) != frames_once and ("obs_frame" in names) == frames_once


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
    with pytest.raises(EnvError, match=r"env.num_splits = 5 is not allowed: expected 1 to the 4"):
        make_atari_vector_env("Pong-v5", "ale", 4, {}, None, 4, 1, 5)
    with pytest.raises(ConfigError, match=r"env.num_splits = 2 is not allowed: expected 1 with"):
        load_config("cartpole_ppo", ["env.num_splits=2"])
    with pytest.raises(ConfigError, match=r"num_splits = 2 .* with topology.inference = 'learner'"):
        load_config("pong_ppo", ["env.num_splits=2", "topology.inference=learner"])
    # A backend that is not installed: its import fails as it would without the package.
    monkeypatch.setitem(sys.modules, "envpool", None)
    with pytest.raises(EnvError, match=r"'envpool' needs the 'envpool' package.*pip install"):
        make_atari_vector_env("Pong-v5", "envpool", 2, {}, None, 4, 1)


@pytest.mark.slow
@pytest.mark.parametrize(
    "experiment, backend, splits, frames_once",
    [("pong_ppo", "envpool", 2, True), ("breakout_impala", "ale", 1, False)],
)
def test_each_backend_trains_under_mpiexec_with_exact_accounting(
    run_dir, experiment, backend, splits, frames_once
):
    """1 learner + 2 env ranks, six updates of each shipped Atari experiment on each C++
    backend (EnvPool's games in two groups, stepped while the policy acts for the other, their
    frames sent once; ALE's stacks sent whole): the experience reconciles, and the episodes
    reported are whole games (Breakout's five lives take a random policy ~180 steps; one life
    ~35), with a finite score; no Pong game ends this soon, and its score is stated NaN."""
    overrides = [
        f"run.run_dir={run_dir}",
        "run.name=atari",
        "run.progress=false",
        f"env.vectorization={backend}",
        f"env.num_splits={splits}",
        f"env.frames_once={str(frames_once).lower()}",
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
    score, normalized = summary["episode_return_mean"], summary["human_normalized_score"]
    if experiment == "pong_ppo":
        # A policy that has not learnt loses Pong 21 points to a few, which takes longer than
        # the 384 steps each game gets here: no game ends, and no score is reported.
        assert summary["episodes"] == 0 and np.isnan(score) and np.isnan(normalized), summary
    else:
        assert summary["episodes"] >= 1 and np.isfinite(score), summary
        assert normalized == pytest.approx(
            human_normalized_score(atari_game(GAME_OF[experiment]), score)
        )
        lengths = [json.loads(line) for line in (run_dir / "atari" / "metrics.jsonl").open()]
        lengths = [m["episode_length_mean"] for m in lengths if m.get("episode_length_mean")]
        assert lengths and min(lengths) > 100, lengths


# Kung-Fu Master, PPO with pong_ppo's settings on 42x42 frames, 50k agent steps (200k frames) in
# one process: the mean score of the last 20 whole games (the run's episode_return_mean), each
# number measured with this test's command (docs/atari.md, *A learning test*). Untrained (the
# same run with learning rate 1e-12) it is RANDOM_KUNG_FU at seeds 0, 1, 2 (the Atari-57
# table's random play: 258.5); trained, TRAINED_KUNG_FU at the same seeds.
RANDOM_KUNG_FU = (415.0, 430.0, 375.0)
TRAINED_KUNG_FU = (1295.0, 1115.0, 1660.0)
LEARNED_KUNG_FU = 800.0


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_ppo_learns_kung_fu_master_beyond_a_random_policys_score(run_dir):
    """A short Atari run that learns: PPO (pong_ppo's hyperparameters, the Nature CNN) on
    Kung-Fu Master's 42x42 frames for 50k agent steps at seed 0 (~2 CPU-minutes) ends with its
    last 20 games scoring over LEARNED_KUNG_FU, about twice what the same run scores untrained
    (its 20-game means stayed within 305-640 all along, at each of the three seeds).
    Kung-Fu Master rewards what is learnt early (walk left, kick); Breakout at 100k steps and
    Boxing at 60k had not left random play with these settings."""
    overrides = [
        f"run.run_dir={run_dir}",
        "run.name=kung_fu",
        "run.progress=false",
        "run.seed=0",
        "env.id=ALE/KungFuMaster-v5",
        "env.kwargs.img_height=42",
        "env.kwargs.img_width=42",
        "env.num_threads=1",
        "run.total_env_steps=50000",
    ]
    proc = run_command(
        agentenv_command("train", "pong_ppo", *settings(*overrides)), timeout=900, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((run_dir / "kung_fu" / "summary.json").read_text())
    assert summary["env_steps"] >= 49_000 and summary["episodes"] >= 20, summary
    assert 1.5 * max(RANDOM_KUNG_FU) < LEARNED_KUNG_FU < min(TRAINED_KUNG_FU)
    assert summary["episode_return_mean"] > LEARNED_KUNG_FU, summary
