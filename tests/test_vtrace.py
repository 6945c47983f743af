"""V-trace against a plain numpy implementation of the paper's definition."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agentenv_jax.algorithms.returns import compute_gae, compute_vtrace, next_state_values


def numpy_vtrace(log_rhos, rewards, values, next_values, ends, gamma, rho_bar, c_bar, pg_bar):
    """The sum form of Espeholt et al. (2018), eq. (1), one env and one start step at a time."""
    t_len, batch = rewards.shape
    rhos = np.exp(log_rhos)
    vs = np.zeros_like(values)
    for b in range(batch):
        for s in range(t_len):
            total, trace = values[s, b], 1.0
            for t in range(s, t_len):
                delta = min(rho_bar, rhos[t, b]) * (
                    rewards[t, b] + gamma * next_values[t, b] - values[t, b]
                )
                total += (gamma ** (t - s)) * trace * delta
                if ends[t, b]:
                    break
                trace *= min(c_bar, rhos[t, b])
            vs[s, b] = total
    pg = np.zeros_like(values)
    for b in range(batch):
        for t in range(t_len):
            v_next = next_values[t, b] if (ends[t, b] or t == t_len - 1) else vs[t + 1, b]
            pg[t, b] = min(pg_bar, rhos[t, b]) * (rewards[t, b] + gamma * v_next - values[t, b])
    return vs, pg


@pytest.mark.parametrize(
    "seed, clips", [(0, (1.0, 1.0, 1.0)), (1, (2.0, 0.9, 1.5)), (2, (1.0, 1.0, 1.0))]
)
def test_vtrace_matches_numpy_reference_on_random_inputs(seed, clips):
    rng = np.random.default_rng(seed)
    t_len, batch, gamma = 12, 4, 0.95
    log_rhos = rng.normal(scale=0.7, size=(t_len, batch)).astype(np.float32)
    rewards = rng.normal(size=(t_len, batch)).astype(np.float32)
    values = rng.normal(size=(t_len, batch)).astype(np.float32)
    terminated = rng.random((t_len, batch)) < 0.1
    truncated = (rng.random((t_len, batch)) < 0.1) & ~terminated
    next_values = next_state_values(
        values,
        rng.normal(size=batch).astype(np.float32),
        terminated,
        truncated,
        rng.normal(size=(t_len, batch)).astype(np.float32),
    )
    ends = terminated | truncated
    vs, pg = jax.jit(compute_vtrace, static_argnums=(5, 6, 7, 8))(
        log_rhos, rewards, values, next_values, ends, gamma, *clips
    )
    ref_vs, ref_pg = numpy_vtrace(
        log_rhos, rewards, values, np.asarray(next_values), ends, gamma, *clips
    )
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pg, ref_pg, rtol=1e-4, atol=1e-5)


def test_on_policy_vtrace_equals_lambda_one_returns():
    """With pi = mu (rho = c = 1), v_s is the n-step bootstrapped return, i.e. GAE(lambda=1)."""
    rng = np.random.default_rng(4)
    rewards = rng.normal(size=(9, 3)).astype(np.float32)
    values = rng.normal(size=(9, 3)).astype(np.float32)
    ends = rng.random((9, 3)) < 0.2
    next_values = next_state_values(
        values, rng.normal(size=3).astype(np.float32), ends, np.zeros_like(ends), values
    )
    vs, _ = compute_vtrace(np.zeros((9, 3), np.float32), rewards, values, next_values, ends, 0.9)
    _, lambda_returns = compute_gae(rewards, values, next_values, ends, 0.9, 1.0)
    np.testing.assert_allclose(vs, lambda_returns, rtol=1e-5, atol=1e-5)
