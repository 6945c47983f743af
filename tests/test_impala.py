"""The IMPALA update: on-policy importance weights are 1, and a step moves the parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentenv_jax.algorithms.impala import IMPALAHyperparams, make_impala_update
from agentenv_jax.algorithms.ppo import TrainState, make_optimizer
from agentenv_jax.networks import action_distribution, init_params, make_actor_critic

from test_ppo import make_rollout


@pytest.mark.slow
def test_impala_update_on_policy_rollout():
    module, apply_fn = make_actor_critic("discrete", 3, 1, (16,), (16,), "tanh", 0.0)
    params = init_params(module, (4,), jax.random.PRNGKey(0))
    dist = action_distribution("discrete")
    rollout = make_rollout(np.random.default_rng(1), 8, 4, 4, 3)
    head, _ = apply_fn(params, rollout["obs"])
    rollout["log_prob"] = np.asarray(dist.log_prob(head, rollout["action"]))  # behaviour = pi
    optimizer = make_optimizer(1e-3, False, 1, 0.5, 1e-5)
    hp = IMPALAHyperparams(
        gamma=0.99, clip_rho=1.0, clip_c=1.0, clip_pg_rho=1.0, vf_coef=0.5, ent_coef=0.01
    )
    update = jax.jit(make_impala_update(apply_fn, dist, optimizer, hp))
    state = TrainState(
        params, optimizer.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(2)
    )
    new_state, metrics = update(state, rollout)
    assert float(metrics["importance_weight_mean"]) == np.float32(1.0)
    assert float(metrics["importance_weight_clipped"]) == 0.0
    assert abs(float(metrics["approx_kl"])) < 1e-6
    assert int(new_state.update_count) == 1
    for name, value in metrics.items():
        assert np.isfinite(float(value)), name
    moved = [
        float(jnp.abs(a - b).max())
        for a, b in zip(
            jax.tree.leaves(state.params), jax.tree.leaves(new_state.params), strict=True
        )
    ]
    assert max(moved) > 0
