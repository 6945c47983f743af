"""The env ranks' numpy policy path against the jitted one: the same actions, log-probs and
values for the same parameters and noise, for every action kind; and when it is chosen."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agentenv_jax.actor.numpy_policy import NumpyActorPolicy
from agentenv_jax.actor.policy import ActorPolicy
from agentenv_jax.config import load_config
from agentenv_jax.envs import EnvError
from agentenv_jax.envs.spaces import EnvSpaces
from agentenv_jax.networks import action_distribution
from agentenv_jax.networks.actor_critic import init_params, make_actor_critic
from agentenv_jax.networks.flat_params import FlatLayout
from agentenv_jax.runtime.policies import uses_numpy_inference

from conftest import EXPERIMENTS

CASES = {
    # kind, head size, nvec, action shape, activation, obs shape, image
    "discrete-tanh": ("discrete", 3, (), (), "tanh", (4,), False),
    "multi_discrete-relu": ("multi_discrete", 7, (3, 4), (2,), "relu", (6,), False),
    "continuous-gelu": ("continuous", 2, (), (2,), "gelu", (5,), False),
    "discrete-mlp-on-pixels": ("discrete", 3, (), (), "tanh", (6, 5, 1), True),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_numpy_and_jitted_policies_agree(case):
    kind, size, nvec, shape, activation, obs_shape, image = CASES[case]
    module, apply_fn = make_actor_critic(
        kind, size, len(obs_shape), (32, 32), (16,), activation, -0.5, image_obs=image
    )
    params = init_params(module, obs_shape, jax.random.PRNGKey(3))
    layout = FlatLayout(params)
    flat = np.asarray(layout.ravel(params))
    jitted = ActorPolicy(
        apply_fn, layout.unravel, action_distribution(kind, nvec), size, shape, [7, 1]
    )
    plain = NumpyActorPolicy(
        layout.unravel, kind, nvec, size, shape, [7, 1], len(obs_shape), activation, image
    )
    jitted.set_params(flat)
    plain.set_params(flat)
    rng = np.random.default_rng(0)
    for _ in range(5):  # several steps: the two noise streams stay in step
        if image:
            obs = rng.integers(0, 256, (8, *obs_shape), dtype=np.uint8)
        else:
            obs = rng.standard_normal((8, *obs_shape)).astype(np.float32) * 3
        (a1, lp1, v1), (a2, lp2, v2) = jitted.act(obs), plain.act(obs)
        assert a1.shape == a2.shape == (8, *shape) and a1.dtype == a2.dtype
        if kind == "continuous":
            np.testing.assert_allclose(a2, a1, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(a2, a1)
            assert len(np.unique(a1)) > 1  # not a degenerate policy
        np.testing.assert_allclose(lp2, lp1, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(v2, v1, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(plain.value(obs), jitted.value(obs), rtol=1e-4, atol=1e-5)


def _spaces(obs_shape, image: bool) -> EnvSpaces:
    return EnvSpaces(
        obs_shape, "discrete", 3, (), None, None, obs_dtype="uint8" if image else "float32"
    )


def _layout(config, spaces):
    from agentenv_jax.runtime.policies import actor_critic_network

    return actor_critic_network(config, spaces)[2]


def test_auto_takes_numpy_for_small_mlps_and_jit_for_cnns_and_large_mlps():
    small = load_config(EXPERIMENTS / "cartpole_ppo.yaml")
    vector = _spaces((4,), False)
    assert uses_numpy_inference(small, vector, _layout(small, vector))
    large = load_config(None, ["network.actor_hidden=[1024,1024]"])
    assert not uses_numpy_inference(large, vector, _layout(large, vector))
    catch = load_config(EXPERIMENTS / "catch_ppo.yaml")
    pixels = _spaces((10, 5, 1), True)
    assert not uses_numpy_inference(catch, pixels, _layout(catch, pixels))
    forced = load_config(None, ["topology.env_rank_inference=jit"])
    assert not uses_numpy_inference(forced, vector, _layout(forced, vector))
    numpy_cnn = load_config(EXPERIMENTS / "catch_ppo.yaml", ["topology.env_rank_inference=numpy"])
    with pytest.raises(EnvError, match="env_rank_inference = 'numpy' is not allowed with a CNN"):
        uses_numpy_inference(numpy_cnn, pixels, _layout(numpy_cnn, pixels))


def test_a_layout_rebuilt_from_its_leaf_paths_unravels_like_the_traced_one():
    """What the learner sends env ranks at start-up (`leaf_paths`, plain lists): rebuilt
    without JAX, it cuts a flat vector into the same leaves, under the same keys, and the numpy
    policy acts alike with either."""
    kind, size, nvec, shape, activation, obs_shape, image = CASES["multi_discrete-relu"]
    module, _ = make_actor_critic(kind, size, 1, (32, 32), (16,), activation, -0.5)
    params = init_params(module, obs_shape, jax.random.PRNGKey(3))
    traced = FlatLayout(params)
    sent = traced.leaf_paths()
    assert all(isinstance(k, str) for path, _ in sent for k in path)
    rebuilt = FlatLayout.from_leaf_paths(sent)
    assert rebuilt.num_params == traced.num_params
    flat = np.asarray(traced.ravel(params))
    ours = jax.tree_util.tree_leaves_with_path(rebuilt.unravel(flat))
    theirs = jax.tree_util.tree_leaves_with_path(traced.unravel(flat))
    assert [path for path, _ in ours] == [path for path, _ in theirs]
    for (_, a), (_, b) in zip(ours, theirs, strict=True):
        assert isinstance(a, np.ndarray)
        np.testing.assert_array_equal(a, np.asarray(b))
    obs = np.random.default_rng(0).standard_normal((8, *obs_shape)).astype(np.float32)
    policies = [
        NumpyActorPolicy(layout.unravel, kind, nvec, size, shape, [7, 1], 1, activation, False)
        for layout in (traced, rebuilt)
    ]
    for policy in policies:
        policy.set_params(flat)
    (a1, lp1, v1), (a2, lp2, v2) = (policy.act(obs) for policy in policies)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(lp1, lp2)
    np.testing.assert_array_equal(v1, v2)
    with pytest.raises(ValueError, match="only a layout of nested dicts"):
        FlatLayout([np.zeros(3), np.zeros(2)]).leaf_paths()
