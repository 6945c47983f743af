"""The env ranks' per-step bookkeeping, checked bit for bit against plain per-step references.

`Actor` computes episode statistics, rewards and normalizer statistics once per segment, and
`ReplayActor` skips the masks on steps where nothing ended; both must give exactly what a
straightforward per-step loop gives: the same bytes in every segment, the same replay contents.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from agentenv_jax.actor.episodes import episode_statistics
from agentenv_jax.actor.loop import Actor
from agentenv_jax.actor.replay_loop import ReplayActor
from agentenv_jax.buffers.replay import ReplayPartition
from agentenv_jax.buffers.segment_queue import on_policy_segment_spec
from agentenv_jax.envs import normalization as norm
from agentenv_jax.envs.faults import FAULT_KEY, fault_mask
from agentenv_jax.envs.spaces import EnvSpaces
from agentenv_jax.networks.sac_networks import unit_to_bounds
from agentenv_jax.transport.messages import (
    param_message_spec,
    priority_update_spec,
    sample_answer_spec,
    sample_request_spec,
)

OBS_DIM = 3
NUM_ENVS = 6
ROLLOUT = 16

# --- episode statistics of a segment ---------------------------------------------------------


def per_step_episode_statistics(
    rewards: np.ndarray,
    valid: np.ndarray,
    ended: np.ndarray,
    start_return: np.ndarray,
    start_length: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The recursion `episode_statistics` must reproduce, one vector step at a time."""
    episode_return = np.full(rewards.shape, np.nan)
    episode_length = np.zeros(rewards.shape, np.int64)
    running_return, running_length = start_return.copy(), start_length.copy()
    for t in range(rewards.shape[0]):
        running_return += np.where(valid[t], rewards[t], 0.0)
        running_length += valid[t]
        finished = ended[t] & valid[t]
        episode_return[t, finished] = running_return[finished]
        episode_length[t, finished] = running_length[finished]
        running_return[ended[t]] = 0.0
        running_length[ended[t]] = 0
    return episode_return, episode_length, running_return, running_length


def random_masks(
    rng: np.random.Generator, num_steps: int, num_envs: int, mode: str
) -> tuple[np.ndarray, np.ndarray]:
    """`valid, ended` bool `[T, E]` as env ranks produce them, with faults (ends on invalid
    rows): `same_step`, or `next_step` where the step after each end is padding (never ended
    itself); `any` is unstructured."""
    ended = rng.random((num_steps, num_envs)) < 0.15
    if mode == "any":
        return rng.random((num_steps, num_envs)) < 0.8, ended
    valid = np.ones((num_steps, num_envs), bool)
    if mode == "next_step":
        for t in range(1, num_steps):
            valid[t] = ~ended[t - 1]
            ended[t] &= valid[t]
    faulted = ended & (rng.random((num_steps, num_envs)) < 0.3)
    return valid & ~faulted, ended


@pytest.mark.parametrize("mode", ["same_step", "next_step", "any"])
@pytest.mark.parametrize("num_steps", [1, 7, 64])
def test_episode_statistics_match_the_per_step_recursion_bit_for_bit(mode, num_steps):
    rng = np.random.default_rng([1, num_steps, len(mode)])
    num_envs = 5
    got_carry = ref_carry = (np.zeros(num_envs), np.zeros(num_envs, np.int64))
    finished = 0
    for _ in range(6):  # consecutive segments: episodes run across their boundaries
        rewards = rng.normal(size=(num_steps, num_envs)) * 10.0 ** rng.integers(-3, 4)
        valid, ended = random_masks(rng, num_steps, num_envs, mode)
        got = episode_statistics(rewards, valid, ended, *got_carry)
        ref = per_step_episode_statistics(rewards, valid, ended, *ref_carry)
        for a, b in zip(got, ref, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()  # float sums in the same order: the same bits
        got_carry, ref_carry = (got.next_return, got.next_length), ref[2:]
        finished += int(np.count_nonzero(~np.isnan(got.episode_return)))
    assert finished > 0


def test_episode_statistics_when_one_env_runs_through_while_others_end_every_step():
    rng = np.random.default_rng(2)
    num_steps, num_envs = 32, 4
    ended = np.ones((num_steps, num_envs), bool)
    ended[:, 0] = False
    valid = np.ones_like(ended)
    rewards = rng.normal(size=ended.shape)
    start = (rng.normal(size=num_envs), rng.integers(0, 50, num_envs))
    got = episode_statistics(rewards, valid, ended, *start)
    ref = per_step_episode_statistics(rewards, valid, ended, *start)
    for a, b in zip(got, ref, strict=True):
        assert a.tobytes() == b.tobytes()
    assert got.next_length[0] == start[1][0] + num_steps
    assert got.episode_length[0, 1:].tolist() == (start[1][1:] + 1).tolist()
    assert (got.episode_length[1:, 1:] == 1).all()


# --- a scripted vector env, policy and channel ------------------------------------------------


class ScriptedVectorEnv:
    """A vector env whose observations, rewards, ends and faults are drawn from a seeded
    generator whatever the actions, so two actors on two copies see the same stream.

    Ended rows carry `final_obs` (SAME_STEP), and `fault_rate` of truncations are reported as
    faults. Rows after an end in NEXT_STEP mode (padding) get random rewards and flags too: the
    actor must mask them, as it must whatever the env puts there.
    """

    def __init__(
        self, mode: AutoresetMode, seed: int, end_rate: float = 0.06, fault_rate: float = 0.3
    ):
        self.num_envs = NUM_ENVS
        self.metadata = {"autoreset_mode": mode}
        self._mode = mode
        self._rng = np.random.default_rng(seed)
        self._end_rate = end_rate
        self._fault_rate = fault_rate

    def _obs(self) -> np.ndarray:
        return self._rng.normal(size=(self.num_envs, OBS_DIM)).astype(np.float32)

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        rng = self._rng
        reward = rng.normal(size=self.num_envs) * 3.0
        terminated = rng.random(self.num_envs) < self._end_rate
        truncated = rng.random(self.num_envs) < self._end_rate
        info: dict[str, Any] = {}
        ended = terminated | truncated
        if ended.any() and self._mode == AutoresetMode.SAME_STEP:
            info["final_obs"] = np.array(list(self._obs()), dtype=object)
            info["_final_obs"] = ended
            faulted = truncated & ~terminated & (rng.random(self.num_envs) < self._fault_rate)
            info["final_info"] = {
                FAULT_KEY: np.full(self.num_envs, "boom"),
                "_" + FAULT_KEY: faulted,
            }
            reward[faulted] = 0.0
        return self._obs(), reward, terminated, truncated, info

    def close(self) -> None:
        pass


class StubPolicy:
    """Deterministic stand-in for `ActorPolicy` (discrete actions) or the SAC policy
    (`continuous`): actions and values are functions of the observations."""

    has_params = True

    def __init__(self, continuous: bool = False):
        self._continuous = continuous

    def set_params(self, flat_params: np.ndarray) -> None:
        pass

    def act(self, obs: np.ndarray) -> Any:
        if self._continuous:
            return np.tanh(obs[:, :1]).astype(np.float32)
        total = obs.reshape(len(obs), -1).sum(axis=1)
        return (total > 0).astype(np.int32), (-np.abs(total)).astype(np.float32), total

    def value(self, obs: np.ndarray) -> np.ndarray:
        return obs.reshape(len(obs), -1).mean(axis=1).astype(np.float32)


PARAM_SPEC = param_message_spec(1, OBS_DIM)


def param_message(version: int, rng: np.random.Generator) -> np.ndarray:
    """Parameters of `version` with made-up normalizer statistics (different each version)."""
    message = PARAM_SPEC.allocate()
    fields = PARAM_SPEC.views(message)
    fields["version"][0] = version
    fields["obs_stats"][:] = norm.stats_to_flat(norm.stats_of(rng.normal(size=(20, OBS_DIM))))
    fields["return_stats"][:] = norm.stats_to_flat(norm.stats_of(rng.normal(size=(20, 1)) * 4))
    return message


class ScheduledChannel:
    """`poll_params` hands out a new parameter message on a fixed schedule of calls."""

    def __init__(self, messages: dict[int, np.ndarray]):
        self._messages = messages
        self._polls = 0

    def poll_params(self) -> np.ndarray | None:
        self._polls += 1
        return self._messages.get(self._polls)


# --- the on-policy actor ----------------------------------------------------------------------


class PerStepActor(Actor):
    """`Actor` with every statistic updated at every vector step, as it was first written
    (less its timers and the clipping of continuous actions)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._pending_reset = np.zeros(self._num_envs, dtype=bool)
        self._discounted_return = np.zeros(self._num_envs, dtype=np.float64)

    def _fill_segment(self, fields: dict[str, np.ndarray]) -> tuple[float, float]:
        segment_obs: list[np.ndarray] = []
        segment_returns: list[np.ndarray] = []
        fields["episode_return"][...] = np.nan
        fields["episode_length"][...] = 0
        fields["bootstrap_value"][...] = 0.0
        fields["policy_version"][...] = self._version
        for t in range(self._rollout_length):
            if t > 0 and self._max_policy_lag > 0:
                message = self._channel.poll_params()
                if message is not None:
                    self._load_params(message)
                    fields["policy_version"][t:] = self._version
            valid = ~self._pending_reset
            obs_in = self._observe(self._obs)
            action, log_prob, value = self._policy.act(obs_in)
            next_obs, reward, terminated, truncated, info = self._env.step(action)
            next_obs = np.asarray(next_obs, dtype=self._obs_dtype)
            reward = np.asarray(reward, dtype=np.float64)
            terminated = np.asarray(terminated, dtype=bool) & valid
            truncated = np.asarray(truncated, dtype=bool) & valid & ~terminated
            ended = terminated | truncated
            faulted = fault_mask(info, self._num_envs) & valid
            self.env_faults += int(faulted.sum())
            valid = valid & ~faulted
            if self._normalize_obs and valid.any():
                segment_obs.append(self._obs[valid].reshape(int(valid.sum()), -1))
            self._discounted_return = self._discounted_return * self._gamma + reward
            if self._normalize_reward and valid.any():
                segment_returns.append(self._discounted_return[valid][:, None])
            scaled_reward = reward
            if self._normalize_reward:
                scaled_reward = norm.scale(reward[:, None], self._return_stats, self._clip_reward)
                scaled_reward = scaled_reward[:, 0]
            self._episode_return += np.where(valid, reward, 0.0)
            self._episode_length += valid
            fields["obs"][t] = obs_in
            fields["action"][t] = action
            fields["reward"][t] = np.where(valid, scaled_reward, 0.0)
            fields["log_prob"][t] = log_prob
            fields["value"][t] = value
            fields["terminated"][t] = terminated
            fields["truncated"][t] = truncated
            fields["valid"][t] = valid
            if ended.any():
                finished = ended & ~faulted
                fields["episode_return"][t, finished] = self._episode_return[finished]
                fields["episode_length"][t, finished] = self._episode_length[finished]
                self._episode_return[ended] = 0.0
                self._episode_length[ended] = 0
                self._discounted_return[ended] = 0.0
            if truncated.any():
                final_value = self._policy.value(
                    self._observe(self._final_obs(next_obs, truncated, info))
                )
                fields["bootstrap_value"][t] = np.where(truncated, final_value, 0.0)
            if faulted.any():
                fields["bootstrap_value"][t, faulted] = value[faulted] / max(self._gamma, 1e-8)
            self.produced += int(valid.sum())
            if self._next_step_mode:
                self._pending_reset = ended
            self._obs = next_obs
        last_obs = self._observe(self._obs)
        fields["last_obs"][:] = last_obs
        fields["last_value"][:] = self._policy.value(last_obs)
        fields["obs_stats"][:] = norm.stats_to_flat(
            norm.stats_of(np.concatenate(segment_obs))
            if segment_obs
            else norm.empty_stats(self._spaces.normalizer_dim)
        )
        fields["return_stats"][:] = norm.stats_to_flat(
            norm.stats_of(np.concatenate(segment_returns))
            if segment_returns
            else norm.empty_stats(1)
        )
        fields["sequence"][0] = self._sequence
        fields["env_faults"][0] = self.env_faults
        self._sequence += 1
        self._segments_filled += 1
        return 0.0, 0.0


DISCRETE = EnvSpaces(
    obs_shape=(OBS_DIM,),
    action_kind="discrete",
    action_size=2,
    action_shape=(),
    action_low=None,
    action_high=None,
)


def fill_segments(
    actor_class: type[Actor],
    mode: AutoresetMode,
    normalize: bool,
    lag: int,
    fault_rate: float,
    policy: Any = None,
    **settings: Any,
) -> list[bytes]:
    """Eight segments of `actor_class` on the scripted env, as bytes, then its counts; parameter
    messages arrive mid-segment when `lag > 0`."""
    rng = np.random.default_rng(3)
    first, *later = (param_message(version, rng) for version in range(4))
    channel = ScheduledChannel({5: later[0], 31: later[1], 32: later[2]})
    spec = on_policy_segment_spec(DISCRETE, ROLLOUT, NUM_ENVS)
    actor = actor_class(
        ScriptedVectorEnv(mode, seed=4, fault_rate=fault_rate),
        DISCRETE,
        policy or StubPolicy(),
        channel,
        spec,
        PARAM_SPEC,
        seed=0,
        env_offset=0,
        rollout_length=ROLLOUT,
        gamma=0.97,
        normalize_obs=normalize,
        normalize_reward=normalize,
        clip_obs=2.0,
        clip_reward=3.0,
        max_inflight_segments=1,
        max_policy_lag=lag,
        timeout_s=10.0,
        **settings,
    )
    actor._load_params(first)
    segments = []
    for _ in range(8):
        buffer = spec.allocate()
        actor._fill_segment(spec.views(buffer))
        segments.append(buffer.tobytes())
    return segments + [repr((actor.produced, actor.env_faults)).encode()]


@pytest.mark.parametrize(
    ("mode", "normalize", "lag", "fault_rate"),
    [
        (AutoresetMode.SAME_STEP, True, 0, 0.0),  # every row valid
        (AutoresetMode.SAME_STEP, True, 2, 0.3),
        (AutoresetMode.SAME_STEP, False, 2, 0.3),
        (AutoresetMode.NEXT_STEP, True, 2, 0.0),
        (AutoresetMode.NEXT_STEP, False, 0, 0.0),
    ],
)
def test_actor_segments_are_bit_identical_to_per_step_bookkeeping(mode, normalize, lag, fault_rate):
    """Masks, scaled rewards (statistics swapped mid-segment when lag > 0), episode returns
    and lengths across segment boundaries, faults, bootstraps and normalizer statistics."""
    expected = fill_segments(PerStepActor, mode, normalize, lag, fault_rate)
    got = fill_segments(Actor, mode, normalize, lag, fault_rate)
    assert len(got) == len(expected)
    for index, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a == b, f"segment {index} differs"
    spec = on_policy_segment_spec(DISCRETE, ROLLOUT, NUM_ENVS)
    fields = spec.views(np.frombuffer(got[-2], np.uint8).copy())
    assert np.isfinite(fields["episode_return"]).any()  # episodes did finish there
    assert fields["valid"].all() == (mode == AutoresetMode.SAME_STEP and fault_rate == 0)


class NoValuePolicy(StubPolicy):
    def value(self, obs: np.ndarray) -> np.ndarray:
        raise AssertionError("the policy's value pass was called")


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP])
def test_segments_without_bootstraps_skip_the_value_pass_and_carry_zero_values(mode):
    """Critic-free updates (group advantages) read no state values: the env rank leaves
    `last_value` and `bootstrap_value` 0 and never runs the policy's value pass; the rest of
    each segment is what a bootstrapping env rank sends."""
    expected = fill_segments(Actor, mode, True, 0, 0.0)
    got = fill_segments(Actor, mode, True, 0, 0.0, NoValuePolicy(), bootstraps=False)
    spec = on_policy_segment_spec(DISCRETE, ROLLOUT, NUM_ENVS)
    assert got[-1] == expected[-1]
    truncations = 0
    for a, b in zip(got[:-1], expected[:-1], strict=True):
        ours, theirs = (spec.views(np.frombuffer(x, np.uint8)) for x in (a, b))
        for name in ours:
            if name in ("last_value", "bootstrap_value"):
                assert not ours[name].any(), name
            else:
                np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
        truncations += int(theirs["bootstrap_value"].any())
    assert truncations > 0  # the bootstrapping env rank did write values there


# --- the replay actor -------------------------------------------------------------------------


class PerStepReplayActor(ReplayActor):
    """`ReplayActor` with the masks applied at every vector step, as it was first written
    (less its timers and random actions)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._pending_reset = np.zeros(self._num_envs, bool)

    def _step(self) -> None:
        valid = ~self._pending_reset
        action = self._policy.act(self._obs)
        env_action = unit_to_bounds(action, self._low, self._high)
        next_obs, reward, terminated, truncated, info = self._env.step(env_action)
        next_obs = np.asarray(next_obs, np.float32)
        terminated = np.asarray(terminated, bool) & valid
        truncated = np.asarray(truncated, bool) & valid & ~terminated
        ended = terminated | truncated
        faulted = fault_mask(info, self._num_envs) & valid
        for env in np.flatnonzero(faulted):
            self._partition.drop_pending(env)
        self.env_faults += int(faulted.sum())
        valid = valid & ~faulted
        final_obs = next_obs
        if not self._next_step_mode and ended.any():
            final_obs = next_obs.copy()
            for i in np.flatnonzero(ended):
                final_obs[i] = np.asarray(info["final_obs"][i], np.float32)
        self._partition.add_step(
            self._obs,
            action,
            np.asarray(reward, np.float32),
            final_obs,
            terminated,
            truncated,
            valid,
        )
        self.produced += int(valid.sum())
        self._episode_return += np.where(valid, reward, 0.0)
        self._episode_length += valid
        for i in np.flatnonzero(ended & ~faulted):
            self._finished.append((float(self._episode_return[i]), int(self._episode_length[i])))
            self._episodes_finished += 1
        self._episode_return[ended] = 0.0
        self._episode_length[ended] = 0
        if self._next_step_mode:
            self._pending_reset = ended
        self._obs = next_obs


CONTINUOUS = EnvSpaces(
    obs_shape=(OBS_DIM,),
    action_kind="continuous",
    action_size=1,
    action_shape=(1,),
    action_low=(-2.0,),
    action_high=(2.0,),
)


REPLAY_FIELDS = ("obs", "action", "reward", "next_obs", "discount")


def replay_steps(actor_class: type[ReplayActor], mode, n_step: int) -> dict[str, Any]:
    """What 150 vector steps of `actor_class` on the scripted env leave behind."""
    partition = ReplayPartition(
        1000, (OBS_DIM,), 1, prioritized=False, alpha=0.6, n_step=n_step, gamma=0.9, num_envs=6
    )
    actor = actor_class(
        ScriptedVectorEnv(mode, seed=5, end_rate=0.04),
        CONTINUOUS,
        StubPolicy(continuous=True),
        None,  # `_step` never touches the channel
        partition,
        PARAM_SPEC,
        sample_request_spec(),
        sample_answer_spec(8, (OBS_DIM,), 1),
        priority_update_spec(8),
        seed=0,
        env_offset=0,
        random_steps=0,
        timeout_s=10.0,
    )
    for _ in range(150):
        actor._step()
    state: dict[str, Any] = {
        name: getattr(partition, name)[: partition.size].tobytes() for name in REPLAY_FIELDS
    }
    state.update(
        finished=actor._finished,
        episodes=actor._episodes_finished,
        produced=actor.produced,
        faults=actor.env_faults,
        counters=partition.counters,
        pending=partition.pending,
        running=(actor._episode_return.tobytes(), actor._episode_length.tobytes()),
    )
    return state


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP])
@pytest.mark.parametrize("n_step", [1, 3])
def test_replay_actor_matches_per_step_masks(mode, n_step):
    """Insertions, finished episodes (their float returns), faults and counts."""
    expected = replay_steps(PerStepReplayActor, mode, n_step)
    got = replay_steps(ReplayActor, mode, n_step)
    assert got == expected
    assert len(got["finished"]) > 5
    if mode == AutoresetMode.SAME_STEP:
        assert got["faults"] > 0
