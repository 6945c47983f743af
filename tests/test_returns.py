"""GAE and next-state values against a plain numpy reference."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agentenv_jax.algorithms.returns import compute_gae, next_state_values


def numpy_gae(rewards, values, last_value, terminated, truncated, bootstrap, gamma, lam):
    """Textbook GAE, one env at a time, written independently of the JAX version."""
    t_len, batch = rewards.shape
    advantages = np.zeros_like(rewards)
    for b in range(batch):
        running = 0.0
        for t in reversed(range(t_len)):
            if terminated[t, b]:
                next_value, running = 0.0, 0.0
            elif truncated[t, b]:
                next_value, running = bootstrap[t, b], 0.0
            else:
                next_value = values[t + 1, b] if t + 1 < t_len else last_value[b]
            delta = rewards[t, b] + gamma * next_value - values[t, b]
            running = delta + gamma * lam * running
            advantages[t, b] = running
    return advantages, advantages + values


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_numpy_reference(seed):
    rng = np.random.default_rng(seed)
    t_len, batch, gamma, lam = 17, 5, 0.97, 0.9
    rewards = rng.normal(size=(t_len, batch)).astype(np.float32)
    values = rng.normal(size=(t_len, batch)).astype(np.float32)
    last_value = rng.normal(size=batch).astype(np.float32)
    terminated = rng.random((t_len, batch)) < 0.1
    truncated = (rng.random((t_len, batch)) < 0.1) & ~terminated
    bootstrap = rng.normal(size=(t_len, batch)).astype(np.float32)

    next_values = next_state_values(values, last_value, terminated, truncated, bootstrap)
    advantages, returns = jax.jit(compute_gae, static_argnums=(4, 5))(
        rewards, values, next_values, terminated | truncated, gamma, lam
    )
    ref_adv, ref_ret = numpy_gae(
        rewards, values, last_value, terminated, truncated, bootstrap, gamma, lam
    )
    np.testing.assert_allclose(advantages, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns, ref_ret, rtol=1e-5, atol=1e-5)


def test_gae_hand_computed_two_steps():
    # T=2, one env, no episode end: delta_1 = 1 + 0.5*4 - 2 = 1; delta_0 = 1 + 0.5*2 - 1 = 1;
    # A_1 = 1; A_0 = 1 + 0.5*0.5*1 = 1.25.
    rewards = np.array([[1.0], [1.0]], np.float32)
    values = np.array([[1.0], [2.0]], np.float32)
    no = np.zeros((2, 1), bool)
    next_values = next_state_values(values, np.array([4.0], np.float32), no, no, values)
    advantages, returns = compute_gae(rewards, values, next_values, no, 0.5, 0.5)
    np.testing.assert_allclose(advantages[:, 0], [1.25, 1.0])
    np.testing.assert_allclose(returns[:, 0], [2.25, 3.0])


def test_truncation_bootstraps_and_termination_does_not():
    values = np.zeros((1, 2), np.float32)
    terminated = np.array([[True, False]])
    truncated = np.array([[False, True]])
    bootstrap = np.array([[7.0, 3.0]], np.float32)
    next_values = next_state_values(
        values, np.array([9.0, 9.0], np.float32), terminated, truncated, bootstrap
    )
    np.testing.assert_allclose(next_values, [[0.0, 3.0]])
