"""Tests of the multi-agent envs: the numpy navigation and predator-prey envs, and the bridges to
PettingZoo (`ParallelView`, `PettingZooVectorEnv` over MPE2)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import numpy as np
import pytest
from mpe2 import simple_speaker_listener_v4, simple_spread_v3, simple_tag_v3
from pettingzoo.test import parallel_api_test

from agentenv_jax.envs.multi_agent import (
    MultiAgentStep,
    NavigationVectorEnv,
    ParallelView,
    PettingZooVectorEnv,
    PredatorPreyVectorEnv,
)

ENVS: dict[str, Callable[[int], NavigationVectorEnv | PredatorPreyVectorEnv]] = {
    "navigation": NavigationVectorEnv,
    "predator_prey": PredatorPreyVectorEnv,
}


def simple_spread():
    return simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=False)


def assert_steps_equal(a: MultiAgentStep, b: MultiAgentStep) -> None:
    for field in dataclasses.fields(MultiAgentStep):
        x, y = getattr(a, field.name), getattr(b, field.name)
        assert x.dtype == y.dtype, field.name
        np.testing.assert_array_equal(x, y, err_msg=field.name)


def env_row(step: MultiAgentStep, i: int) -> MultiAgentStep:
    """Env `i` of a batch's step, as a batch of one."""
    return MultiAgentStep(
        **{f.name: getattr(step, f.name)[i : i + 1] for f in dataclasses.fields(step)}
    )


@pytest.mark.parametrize("name", ENVS)
def test_builtin_envs_pass_pettingzoo_parallel_api_test(name):
    view = ParallelView(ENVS[name](1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel_api_test(view, num_cycles=1000)
    assert not caught, [str(w.message) for w in caught]
    assert view.state().shape == view.state_space.shape


@pytest.mark.parametrize("name", ENVS)
def test_builtin_envs_return_the_protocols_arrays(name):
    env = ENVS[name](5)
    e, n, d, s = 5, len(env.agents), env.obs_size, env.state_size
    shapes = {"obs": (e, n, d), "state": (e, s), "final_obs": (e, n, d), "final_state": (e, s)}
    shapes |= {"reward": (e, n), "terminated": (e, n), "truncated": (e, n), "active": (e, n)}
    shapes |= {"acted": (e, n), "episode_ended": (e,)}
    floats = {"obs", "state", "reward", "final_obs", "final_state"}
    for step in [env.reset(seed=0), env.step(np.zeros((e, n), np.int64))]:
        for field, shape in shapes.items():
            array = getattr(step, field)
            assert array.shape == shape and array.flags.c_contiguous, field
            assert array.dtype == (np.float32 if field in floats else bool), field


@pytest.mark.parametrize("name", ENVS)
def test_env_i_of_a_batch_replays_a_batch_of_one_seeded_seed_plus_i(name):
    make = ENVS[name]
    batch, again = make(3), make(3)
    singles = [make(1) for _ in range(3)]
    assert_steps_equal(batch.reset(seed=7), again.reset(seed=7))
    first = batch.reset(seed=7)
    for i, single in enumerate(singles):
        assert_steps_equal(env_row(first, i), single.reset(seed=7 + i))
    rng = np.random.default_rng(1)
    ended = 0
    for _ in range(120):  # past the horizon: auto-resets draw from each env's own generator
        actions = rng.integers(0, 5, (3, len(batch.agents)))
        step = batch.step(actions)
        assert_steps_equal(step, again.step(actions))
        for i, single in enumerate(singles):
            assert_steps_equal(env_row(step, i), single.step(actions[i : i + 1]))
        ended += step.episode_ended.sum()
    assert ended >= 6


def test_navigation_reward_of_a_placed_world():
    """Landmarks at distance 0.5, 0 and 1 from their closest agents; agents 0 and 1 overlap."""
    agent_pos = np.array([[[0.0, 0.0], [0.2, 0.0], [1.0, 1.0]]])
    landmark_pos = np.array([[[0.0, 0.5], [1.0, 1.0], [-1.0, 0.0]]])
    for local_ratio, expected in [(0.5, [-1.25, -1.25, -0.75]), (0.0, [-1.5, -1.5, -1.5])]:
        env = NavigationVectorEnv(1, local_ratio=local_ratio)
        env.reset(seed=0)
        env.set_world(agent_pos, landmark_pos)
        step = env.step(np.zeros((1, 3), np.int64))
        np.testing.assert_allclose(step.reward[0], expected, rtol=1e-6)
        # Positions move with the velocity before the step (zero); the overlap's contact force
        # (100 * penetration 0.1) pushes agents 0 and 1 apart at 10 * dt = 1.
        expected_obs_0 = [0.0, 0.0, 0.5, 1.0, 1.0, -1.0, 0.0, 0.2, 0.0, 1.0, 1.0]
        np.testing.assert_allclose(step.obs[0, 0, 3:], expected_obs_0, atol=1e-6)
        np.testing.assert_allclose(step.obs[0, :, :2], [[-1, 0], [1, 0], [0, 0]], atol=1e-3)
        assert env.obs_size == 14 and env.state_size == 18


def test_navigation_matches_mpe2_simple_spread():
    """Same seed, same actions: same observations (less MPE's zero comm slots) and rewards,
    across an auto-reset."""
    ours = NavigationVectorEnv(2)
    theirs = PettingZooVectorEnv(simple_spread, 2)
    a, b = ours.reset(seed=3), theirs.reset(seed=3)
    np.testing.assert_allclose(a.obs, b.obs[:, :, :14], atol=1e-6)
    rng = np.random.default_rng(2)
    for t in range(1, 31):
        actions = rng.integers(0, 5, (2, 3))
        a, b = ours.step(actions), theirs.step(actions)
        np.testing.assert_allclose(a.obs, b.obs[:, :, :14], atol=1e-5)
        np.testing.assert_allclose(a.final_obs, b.final_obs[:, :, :14], atol=1e-5)
        np.testing.assert_allclose(a.reward, b.reward, atol=1e-5)
        for field in ["terminated", "truncated", "active", "acted", "episode_ended"]:
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
        assert a.episode_ended.all() == (t == 25)


def test_navigation_auto_reset_returns_final_obs_and_a_new_episode():
    env, longer = NavigationVectorEnv(2), NavigationVectorEnv(2, max_episode_steps=26)
    env.reset(seed=5)
    longer.reset(seed=5)
    rng = np.random.default_rng(3)
    for t in range(1, 51):
        actions = rng.integers(0, 5, (2, 3))
        step = env.step(actions)
        assert not step.terminated.any() and step.active.all() and step.acted.all()
        if t % 25:
            assert not step.episode_ended.any() and not step.truncated.any()
            assert not step.final_obs.any() and not step.final_state.any()
        else:
            assert step.episode_ended.all() and step.truncated.all()
        if t == 25:
            reference = longer.step(actions)  # the same episode, not yet ended
            np.testing.assert_array_equal(step.final_obs, reference.obs)
            np.testing.assert_array_equal(step.final_state, reference.state)
            assert not step.obs[:, :, :2].any()  # a new episode starts at rest
            assert np.abs(step.obs[:, :, 2:4]).max() <= 1.0
            assert not np.allclose(step.obs, step.final_obs)
        elif t < 25:
            longer.step(actions)


def test_predator_prey_moves_and_scores_as_mpe2_simple_tag_until_a_catch():
    """MPE's prey are never removed: up to the first catch (included, for rewards), the two envs
    agree on every agent's velocity and position, and on rewards (arena penalty, +-10)."""
    ours = PredatorPreyVectorEnv(4)
    theirs = PettingZooVectorEnv(
        lambda: simple_tag_v3.parallel_env(num_good=2, num_adversaries=2, max_cycles=50), 4
    )
    a, b = ours.reset(seed=3), theirs.reset(seed=3)
    rng = np.random.default_rng(0)
    while not a.terminated.any():
        np.testing.assert_allclose(a.obs[:, :, 1:5], b.obs[:, :, :4], atol=1e-5)
        actions = rng.integers(0, 5, (4, 4))
        a, b = ours.step(actions), theirs.step(actions)
        np.testing.assert_allclose(a.reward, b.reward, atol=1e-4)
    assert a.reward[a.terminated].max() <= -10.0  # the caught prey


def test_caught_prey_terminates_and_sits_out_while_the_others_go_on():
    env = PredatorPreyVectorEnv(1, num_predators=2, num_prey=2, num_obstacles=0)
    env.reset(seed=0)
    no_op = np.zeros((1, 4), np.int64)
    # predator_0 touches prey_0; predator_1 and prey_1 are far from everyone.
    env.set_world(
        np.array([[[0.0, 0.0], [-0.5, -0.5], [0.05, 0.0], [0.5, 0.5]]]), np.zeros((1, 0, 2))
    )
    step = env.step(no_op)
    np.testing.assert_array_equal(step.terminated[0], [False, False, True, False])
    np.testing.assert_array_equal(step.reward[0], [10.0, 10.0, -10.0, 0.0])
    np.testing.assert_array_equal(step.active[0], [True, True, False, True])
    assert step.acted.all() and not step.truncated.any() and not step.episode_ended.any()
    assert not step.obs[0, 2].any()
    # predator_0 sees predator_1, prey_0, prey_1: prey_0's slot (position, velocity, alive) is 0.
    assert step.obs[0, 0, 0] == 1.0 and step.obs[0, 3, 0] == 0.0
    assert not step.obs[0, 0, 10:15].any() and step.obs[0, 0, 19] == 1.0
    assert not step.state[0, 10:15].any() and step.state[0, 19] == 1.0

    for _ in range(3):
        step = env.step(np.full((1, 4), 2))
        np.testing.assert_array_equal(step.acted[0], [True, True, False, True])
        np.testing.assert_array_equal(step.active[0], [True, True, False, True])
        assert step.reward[0, 2] == 0.0 and not step.terminated.any()
        assert not step.obs[0, 2].any() and step.obs[0, 3].any()

    # The last prey caught: it and the predators terminate, and the env auto-resets.
    env.set_world(
        np.array([[[0.0, 0.0], [0.4, 0.4], [0.0, 0.0], [0.45, 0.4]]]), np.zeros((1, 0, 2))
    )
    step = env.step(no_op)
    np.testing.assert_array_equal(step.terminated[0], [True, True, False, True])
    np.testing.assert_array_equal(step.reward[0], [10.0, 10.0, 0.0, -10.0])
    assert step.episode_ended[0] and not step.truncated.any()
    assert step.final_obs[0, :2].any() and not step.final_obs[0, 2:].any()
    np.testing.assert_array_equal(step.final_state[0, 4::5], [1.0, 1.0, 0.0, 0.0])
    assert step.active.all() and step.obs[0, 2:].any()
    np.testing.assert_array_equal(step.state[0, 4::5], [1.0, 1.0, 1.0, 1.0])


def test_parallel_view_drops_caught_prey_and_does_not_auto_reset():
    view = ParallelView(PredatorPreyVectorEnv(1, num_obstacles=0))
    view.reset(seed=0)
    view.env.set_world(
        np.array([[[0.0, 0.0], [-0.5, -0.5], [0.05, 0.0], [0.5, 0.5]]]), np.zeros((1, 0, 2))
    )
    obs, rewards, terminations, truncations, infos = view.step(dict.fromkeys(view.agents, 0))
    assert set(obs) == set(rewards) == set(terminations) == set(infos) == set(view.possible_agents)
    assert terminations == {
        "predator_0": False,
        "predator_1": False,
        "prey_0": True,
        "prey_1": False,
    }
    assert rewards["prey_0"] == -10.0 and view.agents == ["predator_0", "predator_1", "prey_1"]
    for _ in range(49):
        obs, rewards, terminations, truncations, infos = view.step(dict.fromkeys(view.agents, 0))
        if not view.agents:
            break
    assert not view.agents and set(truncations) == {"predator_0", "predator_1", "prey_1"}
    assert all(truncations.values()) and all(o.any() for o in obs.values())
    assert view.state()[4::5].tolist() == [1.0, 1.0, 0.0, 1.0]  # the state it ended in
    with pytest.raises(RuntimeError, match="reset"):
        view.step({})
    obs, _ = view.reset()
    assert view.agents == view.possible_agents and set(obs) == set(view.possible_agents)


def test_pettingzoo_vector_env_over_mpe2_simple_spread():
    env = PettingZooVectorEnv(simple_spread, 2)
    assert env.agents == ("agent_0", "agent_1", "agent_2")
    assert (env.obs_size, env.state_size, env.max_episode_steps) == (18, 54, 25)
    assert env.action_space == simple_spread().action_space("agent_0")
    first = env.reset(seed=11)
    for i in range(2):
        observations, _ = simple_spread().reset(seed=11 + i)
        np.testing.assert_array_equal(first.obs[i], np.stack(list(observations.values())))
    assert first.obs.shape == (2, 3, 18) and first.obs.dtype == np.float32
    assert first.state.shape == (2, 54) and first.active.all() and not first.acted.any()
    rng = np.random.default_rng(4)
    for t in range(1, 26):
        step = env.step(rng.integers(0, 5, (2, 3)))
        assert step.reward.shape == (2, 3) and step.reward.dtype == np.float32
        assert step.acted.all() and step.active.all() and not step.terminated.any()
        assert step.episode_ended.all() == step.truncated.all() == (t == 25)
        assert step.final_obs.any() == step.final_state.any() == (t == 25)
    assert not step.obs[:, :, :2].any()  # the new episode's agents start at rest
    env.close()


@pytest.mark.parametrize("name", ENVS)
def test_pettingzoo_vector_env_over_a_parallel_view_is_the_vector_env(name):
    make = ENVS[name]
    native = make(3)
    horizon = native.max_episode_steps
    bridged = PettingZooVectorEnv(lambda: ParallelView(make(1)), 3, max_episode_steps=horizon)
    assert bridged.state_size == native.state_size and bridged.obs_size == native.obs_size
    assert_steps_equal(bridged.reset(seed=21), native.reset(seed=21))
    rng = np.random.default_rng(5)
    sat_out = 0  # steps of agents that had finished while their episode went on
    for _ in range(2 * horizon + 5):
        actions = rng.integers(0, 5, (3, len(native.agents)))
        step = native.step(actions)
        assert_steps_equal(bridged.step(actions), step)
        sat_out += (~step.acted).sum()
    assert sat_out > 0 if name == "predator_prey" else sat_out == 0


def test_pettingzoo_vector_env_horizon_may_only_shorten_the_envs_own():
    env = PettingZooVectorEnv(simple_spread, 1, max_episode_steps=10)
    env.reset(seed=0)
    ended = [env.step(np.zeros((1, 3), np.int64)).episode_ended[0] for _ in range(20)]
    assert [t for t, end in enumerate(ended, 1) if end] == [10, 20]
    with pytest.raises(ValueError, match="max_cycles=25"):
        PettingZooVectorEnv(simple_spread, 1, max_episode_steps=30)
    with pytest.raises(ValueError, match="max_episode_steps"):
        PettingZooVectorEnv(lambda: ParallelView(NavigationVectorEnv(1)), 1)


def test_pettingzoo_agents_need_one_action_space_or_discrete_ones():
    discrete = PettingZooVectorEnv(
        lambda: simple_speaker_listener_v4.parallel_env(continuous_actions=False), 1
    )
    assert discrete.action_space.n == 5
    assert discrete.action_counts == (3, 5)  # speaker, listener
    discrete.close()
    with pytest.raises(ValueError, match="simple_speaker_listener.*share one action space"):
        PettingZooVectorEnv(
            lambda: simple_speaker_listener_v4.parallel_env(continuous_actions=True), 1
        )
