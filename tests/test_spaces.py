"""Supported spaces: how each observation space travels (uint8 images, one-hot, flattened
Dict/Tuple, stacked frames), MultiDiscrete actions, and the clear errors for the rest."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from agentenv_jax.buffers.segment_queue import on_policy_segment_spec
from agentenv_jax.config import load_config
from agentenv_jax.envs.catch import CATCH_ID, Catch
from agentenv_jax.envs.factory import EnvError, describe_spaces, make_vector_env
from agentenv_jax.envs.observation_wrappers import wrap_observations
from agentenv_jax.runtime.roles import check_spaces_fit, plan_for, prepare_env_rank
from agentenv_jax.transport.topology import make_topology

from conftest import EXPERIMENTS
from envs_for_tests import CueEnv

CARTPOLE = EXPERIMENTS / "cartpole_ppo.yaml"
BOX2 = gym.spaces.Box(-1, 1, (2,), np.float32)


@pytest.mark.parametrize(
    "obs_space, shape, dtype",
    [
        (gym.spaces.Box(0, 255, (6, 5, 3), np.uint8), (6, 5, 3), "uint8"),
        (gym.spaces.Box(0, 255, (6, 5), np.uint8), (6, 5), "uint8"),
        (gym.spaces.Box(0, 255, (128,), np.uint8), (128,), "float32"),  # RAM bytes: no image
        (gym.spaces.Box(0, 1, (6, 5, 3), np.float32), (6, 5, 3), "float32"),
        (gym.spaces.Discrete(7), (7,), "float32"),
        (gym.spaces.MultiDiscrete([2, 3]), (5,), "float32"),
        (gym.spaces.MultiBinary(4), (4,), "float32"),
        (gym.spaces.Dict({"b": gym.spaces.Discrete(3), "a": BOX2}), (5,), "float32"),
        (gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Dict({"a": BOX2}))), (5,), "float32"),
    ],
)
def test_observation_spaces_travel_as_one_box(obs_space, shape, dtype):
    spaces = describe_spaces("Test-v0", obs_space, gym.spaces.Discrete(2))
    assert (spaces.obs_shape, spaces.obs_dtype) == (shape, dtype)
    assert spaces.normalizer_dim == (0 if dtype == "uint8" else spaces.obs_dim)


@pytest.mark.parametrize(
    "action_space, kind, size, shape, nvec",
    [
        (gym.spaces.Discrete(4), "discrete", 4, (), ()),
        (gym.spaces.MultiDiscrete([3, 4]), "multi_discrete", 7, (2,), (3, 4)),
        (gym.spaces.MultiBinary(3), "multi_discrete", 6, (3,), (2, 2, 2)),
        (gym.spaces.Box(-2, 2, (3,), np.float32), "continuous", 3, (3,), ()),
    ],
)
def test_action_spaces(action_space, kind, size, shape, nvec):
    spaces = describe_spaces("Test-v0", BOX2, action_space)
    assert (spaces.action_kind, spaces.action_size, spaces.action_shape) == (kind, size, shape)
    assert spaces.action_nvec == nvec


@pytest.mark.parametrize(
    "obs_space, action_space, message",
    [
        (
            gym.spaces.Sequence(BOX2),
            gym.spaces.Discrete(2),
            "env.id = 'Odd-v0' has observation space Sequence(.*), which is not supported: "
            "expected a Box, Discrete",
        ),
        (
            gym.spaces.Graph(BOX2, None),
            gym.spaces.Discrete(2),
            "observation space Graph.* not supported",
        ),
        (
            gym.spaces.Dict({"pixels": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), "v": BOX2}),
            gym.spaces.Discrete(2),
            r"observation\['pixels'\] is an image .* not supported inside a Dict/Tuple",
        ),
        (
            gym.spaces.Tuple((BOX2, gym.spaces.Dict({"name": gym.spaces.Text(4)}))),
            gym.spaces.Discrete(2),
            r"observation\[1\]\['name'\] is Text.* not supported inside a Dict/Tuple",
        ),
        (BOX2, gym.spaces.MultiDiscrete([3, 4], start=[1, 0]), "starting at \\[1, 0\\]"),
        (BOX2, gym.spaces.MultiBinary([2, 2]), "action space MultiBinary.* not supported"),
        (BOX2, gym.spaces.Tuple((gym.spaces.Discrete(2),)), "action space Tuple.* not supported"),
    ],
)
def test_unsupported_spaces_are_errors_naming_env_and_space(obs_space, action_space, message):
    with pytest.raises(EnvError, match=message):
        describe_spaces("Odd-v0", obs_space, action_space)


def test_flattened_observations_are_one_hot_in_sorted_key_order():
    env = wrap_observations(CueEnv(obs="nested"), "cue", frame_stack=1)
    assert env.observation_space == gym.spaces.Box(0, 1, (6,), np.float32)
    obs, _ = env.reset(seed=3)
    cue = env.unwrapped._cue
    # Tuple order: the cue one-hot [3]; then the Dict, keys sorted: parity one-hot [2], time [1].
    np.testing.assert_array_equal(obs, [*np.eye(3)[cue], 1, 0, 0])
    assert obs.dtype == np.float32
    obs, *_ = env.step(np.array([0, 0]))
    np.testing.assert_allclose(obs[3:], [0, 1, 1 / 8])


def test_frozen_lake_observes_a_one_hot_cell():
    config = load_config(CARTPOLE, ["env.id=FrozenLake-v1", "env.global_num_envs=2"])
    vector_env = make_vector_env(config.env, 2)
    obs, _ = vector_env.reset(seed=0)
    vector_env.close()
    assert obs.shape == (2, 16) and obs.dtype == np.float32
    np.testing.assert_array_equal(obs, np.eye(16, dtype=np.float32)[[0, 0]])  # the start cell


def test_stacked_image_frames_lie_on_the_channel_axis_oldest_first():
    env = wrap_observations(Catch(rows=6, columns=4), CATCH_ID, frame_stack=3)
    assert env.observation_space.shape == (6, 4, 3) and env.observation_space.dtype == np.uint8
    first, _ = env.reset(seed=0)
    assert all(np.array_equal(first[..., k], first[..., 0]) for k in range(3))  # padded
    frames = [first[..., 2]]
    for _ in range(2):
        obs, *_ = env.step(1)
        frames.append(obs[..., 2])  # the newest frame is the last channel
    np.testing.assert_array_equal(obs, np.stack(frames, axis=-1))
    ball_rows = [int(np.flatnonzero(f[:-1].any(axis=1))[0]) for f in frames]
    assert ball_rows == [0, 1, 2]  # the ball falls from channel to channel


def test_stacked_vector_observations_are_concatenated():
    env = wrap_observations(gym.make("CartPole-v1"), "CartPole-v1", frame_stack=4)
    assert env.observation_space.shape == (16,)
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs[:4], obs[12:])
    newest, *_ = env.step(0)
    np.testing.assert_array_equal(newest[8:12], obs[12:])


def test_native_vectorization_refuses_frame_stacking():
    config = load_config(CARTPOLE, ["env.vectorization=native", "env.frame_stack=2"])
    with pytest.raises(EnvError, match="'native' needs Box observations and env.frame_stack = 1"):
        make_vector_env(config.env, 2)


@pytest.mark.slow
def test_images_travel_as_uint8_from_the_env_rank_into_the_learners_segment():
    """Catch frames with 2 stacked: the segment's `obs`/`last_obs` fields are uint8 and hold the
    env's own frames (two lit pixels, 255, per frame), not floats."""
    config = load_config(
        EXPERIMENTS / "catch_ppo.yaml",
        ["env.global_num_envs=3", "algorithm.rollout_length=4", "env.frame_stack=2"],
    )
    topology = make_topology(config, world_size=1, rank=0)
    vector_env, spaces = prepare_env_rank(config, topology)
    assert (spaces.obs_shape, spaces.obs_dtype) == ((10, 5, 2), "uint8")
    spec = on_policy_segment_spec(spaces, 4, 3)
    assert spec["obs"].dtype == spec["last_obs"].dtype == np.uint8
    assert spec["obs_stats"].shape == (1,)  # no per-pixel normalizer statistics
    assert spec["obs"].nbytes == 4 * 3 * 10 * 5 * 2  # one byte per pixel on the wire
    plan = plan_for(config, topology, spaces)
    transport = plan.make_inprocess()
    actor = plan.make_actor(vector_env, transport.actor)
    plan.make_learner(transport.learner, 1, None, None).start()
    assert actor.run_once()
    vector_env.close()
    segment = spec.views(transport.segments[0])
    obs = np.concatenate([segment["obs"], segment["last_obs"][None]])
    assert set(np.unique(obs)) == {0, 255}
    assert np.all((obs == 255).sum(axis=(2, 3)) == 2)  # ball + paddle in each of 2 frames


def _spaces(obs_space, action_space):
    return describe_spaces("Odd-v0", obs_space, action_space)


IMAGE = gym.spaces.Box(0, 255, (10, 5, 1), np.uint8)


@pytest.mark.parametrize(
    "overrides, spaces, message",
    [
        (["algorithm={name: sac}"], _spaces(IMAGE, BOX2), "'sac' needs vector observations"),
        (
            ["algorithm={name: sac}"],
            _spaces(BOX2, gym.spaces.MultiDiscrete([3, 4])),
            "algorithm.name = 'sac' needs a Box action space",
        ),
        (
            ["env.normalize_obs=true"],
            _spaces(IMAGE, gym.spaces.Discrete(3)),
            r"observes uint8 images \(10, 5, 1\): env.normalize_obs = true is not allowed",
        ),
        (
            ["network.torso=impala_cnn"],
            _spaces(BOX2, gym.spaces.Discrete(3)),
            r"network.torso = 'impala_cnn' needs image observations .* observes Box\(2,\)",
        ),
    ],
)
def test_settings_the_spaces_rule_out_are_start_up_errors(overrides, spaces, message):
    config = load_config(CARTPOLE, overrides)
    with pytest.raises(EnvError, match=message):
        check_spaces_fit(config, spaces, "the action space")
