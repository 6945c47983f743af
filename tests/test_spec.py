"""Experience and parameter message specs: layout and pack/unpack round trips per space."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from agentenv_jax.buffers.segment_queue import SegmentQueue, on_policy_segment_spec
from agentenv_jax.envs.factory import EnvError, describe_spaces
from agentenv_jax.transport.messages import param_message_spec
from agentenv_jax.transport.spec import FieldSpec, MessageSpec

SUPPORTED = {
    "box_obs_discrete_action": (gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(3)),
    "image_obs_discrete_action": (
        gym.spaces.Box(0, 255, (6, 5, 3), np.uint8),
        gym.spaces.Discrete(5),
    ),
    "float64_obs_box_action": (
        gym.spaces.Box(-np.inf, np.inf, (3,), np.float64),
        gym.spaces.Box(-2.0, 2.0, (2,), np.float32),
    ),
}


def random_values(spec: MessageSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    values = {}
    for f in spec.fields:
        if np.issubdtype(f.dtype, np.floating):
            values[f.name] = rng.normal(size=f.shape).astype(f.dtype)
        else:
            values[f.name] = rng.integers(0, 100, size=f.shape).astype(f.dtype)
    return values


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_segment_spec_round_trip(name):
    obs_space, action_space = SUPPORTED[name]
    spaces = describe_spaces("Test-v0", obs_space, action_space)
    spec = on_policy_segment_spec(spaces, rollout_length=5, local_num_envs=3)
    assert spec["obs"].shape == (5, 3, *obs_space.shape)
    expected_action_shape = (
        (5, 3) if isinstance(action_space, gym.spaces.Discrete) else (5, 3, *action_space.shape)
    )
    assert spec["action"].shape == expected_action_shape
    values = random_values(spec, np.random.default_rng(len(name)))
    buffer = spec.pack(values)
    assert buffer.dtype == np.uint8 and buffer.nbytes == spec.nbytes
    # What crosses MPI is the raw bytes: copy them, then read back.
    restored = spec.unpack(np.frombuffer(buffer.tobytes(), dtype=np.uint8).copy())
    for key, value in values.items():
        np.testing.assert_array_equal(restored[key], value)
        assert restored[key].dtype == spec[key].dtype


def test_views_write_in_place_and_fields_are_aligned():
    spec = MessageSpec([FieldSpec("a", (3,), np.uint8), FieldSpec("b", (2,), np.float64)])
    buffer = spec.allocate()
    views = spec.views(buffer)
    views["b"][:] = [1.5, -2.0]
    assert spec.unpack(buffer)["b"].tolist() == [1.5, -2.0]
    assert views["b"].ctypes.data % 8 == 0


def test_param_spec_round_trip():
    spec = param_message_spec(num_params=10, obs_dim=4)
    values = random_values(spec, np.random.default_rng(0))
    restored = spec.unpack(spec.pack(values))
    for key, value in values.items():
        np.testing.assert_array_equal(restored[key], value)


def test_pack_rejects_missing_and_misshapen_fields():
    spec = MessageSpec([FieldSpec("a", (2,), np.float32)])
    with pytest.raises(ValueError, match="missing"):
        spec.pack({})
    with pytest.raises(ValueError, match="shape"):
        spec.pack({"a": np.zeros(3)})
    with pytest.raises(ValueError, match="does not match"):
        spec.views(np.zeros(3, np.uint8))


@pytest.mark.parametrize(
    "obs_space, action_space, message",
    [
        (gym.spaces.Text(5), gym.spaces.Discrete(2), "observation space Text.* not supported"),
        (
            gym.spaces.Box(-1, 1, (2,)),
            gym.spaces.MultiDiscrete([[2, 3], [2, 3]]),
            "(?s)action space MultiDiscrete.* not supported",
        ),
        (
            gym.spaces.Box(-1, 1, (2,)),
            gym.spaces.Box(-1, 1, (2, 2)),
            "action space .* not supported",
        ),
        (gym.spaces.Box(-1, 1, (2,)), gym.spaces.Box(-np.inf, np.inf, (2,)), "unbounded"),
    ],
)
def test_unsupported_spaces_are_clear_errors(obs_space, action_space, message):
    with pytest.raises(EnvError, match=message):
        describe_spaces("Odd-v0", obs_space, action_space)


def test_segment_queue_counts_sent_and_discarded_transitions():
    spaces = describe_spaces("Test-v0", *SUPPORTED["box_obs_discrete_action"])
    spec = on_policy_segment_spec(spaces, rollout_length=4, local_num_envs=2)
    queue = SegmentQueue(spec, capacity=2)
    for valid_rows in (8, 5):
        buffer = queue.acquire()
        spec.views(buffer)["valid"].flat[:valid_rows] = 1
        queue.push(buffer)
    assert queue.depth == 2 and not queue.has_free
    queue.release(queue.pop_ready())
    assert queue.sent_transitions == 8
    assert queue.discard_ready() == 5
    assert queue.depth == 0
