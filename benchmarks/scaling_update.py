"""What `scaling_model.py`'s workers share: the config's PPO update for an MLP, jitted over a
mesh as the learner jits it, synthetic CartPole rollouts of the config's shapes, and the clock
of a run of updates."""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import common
import numpy as np

CONFIG = common.EXPERIMENTS / "cartpole_ppo.yaml"
OBS_DIM, NUM_ACTIONS = 4, 2  # CartPole
WARMUP_UPDATES = 2


@functools.cache
def rollout_length() -> int:
    """T of the config's rollouts."""
    from agentenv_jax.config.loading import load_config

    return load_config(CONFIG).algorithm.rollout_length


def _hidden(net: str) -> tuple[int, ...]:
    """'64x64' -> (64, 64)."""
    return tuple(int(width) for width in net.split("x"))


def synthetic_rollout(rng: np.random.Generator, t_len: int, envs: int) -> dict[str, np.ndarray]:
    """A random but well-formed CartPole rollout, with the dtypes of an env rank's segment."""
    return {
        "obs": rng.normal(size=(t_len, envs, OBS_DIM)).astype(np.float32),
        "action": rng.integers(0, NUM_ACTIONS, size=(t_len, envs)).astype(np.int32),
        "reward": np.ones((t_len, envs), np.float32),
        "log_prob": np.full((t_len, envs), -math.log(NUM_ACTIONS), np.float32),
        "value": rng.normal(size=(t_len, envs)).astype(np.float32),
        "bootstrap_value": np.zeros((t_len, envs), np.float32),
        "terminated": (rng.random((t_len, envs)) < 0.05).astype(np.uint8),
        "truncated": np.zeros((t_len, envs), np.uint8),
        "valid": np.ones((t_len, envs), np.uint8),
        "last_value": rng.normal(size=envs).astype(np.float32),
        "last_obs": rng.normal(size=(envs, OBS_DIM)).astype(np.float32),
    }


def update_on(mesh: Any, net: str, gradient_sync: str = "auto") -> tuple[Any, Any, int, int]:
    """The config's PPO update for a `net` MLP, jitted over `mesh` as the learner jits it
    (`topology.gradient_sync`: auto takes one_psum on a mesh of several devices); its
    replicated initial state, the parameter count and the gradient steps per update."""
    import jax
    import jax.numpy as jnp

    from agentenv_jax.algorithms.ppo import TrainState
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.learner.loop import jit_sharded_update
    from agentenv_jax.learner.on_policy_model import make_on_policy_update
    from agentenv_jax.networks import action_distribution, init_params, make_actor_critic
    from agentenv_jax.parallel.mesh import BATCH_AXIS, replicated, row_constraint

    config = load_config(CONFIG)
    if gradient_sync == "auto":  # as `gradient_data_axis` decides for this PPO MLP
        gradient_sync = "one_psum" if mesh.shape[BATCH_AXIS] > 1 else "xla"
    data_axis = BATCH_AXIS if gradient_sync == "one_psum" else None
    hidden = _hidden(net)
    module, apply_fn = make_actor_critic(
        "discrete", NUM_ACTIONS, 1, hidden, hidden, config.network.activation, 0.0
    )
    update, optimizer = make_on_policy_update(
        config,
        apply_fn,
        action_distribution("discrete"),
        1000,
        row_constraint(mesh),
        data_axis=data_axis,
    )
    params = init_params(module, (OBS_DIM,), jax.random.PRNGKey(0))
    state = TrainState(
        params, optimizer.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(1)
    )
    num_params = sum(int(np.size(leaf)) for leaf in jax.tree.leaves(params))
    grad_steps = config.algorithm.num_epochs * config.algorithm.num_minibatches
    # Host values, the same on every process, replicated over the (possibly global) mesh.
    state = jax.device_put(jax.device_get(state), replicated(mesh))
    return jit_sharded_update(update, mesh, None, data_axis), state, num_params, grad_steps


def clock_updates(update: Any, state: Any, place: Any, count: int, barrier: Any) -> tuple:
    """`count` updates from a barrier, each of a rollout `place()` puts on the mesh from the
    host and each waited for (its metrics read back), as the learner runs them; the new state
    and the seconds."""
    import jax

    barrier()
    started = time.perf_counter()
    for _ in range(count):
        state, metrics = update(state, place())
        jax.device_get(metrics)
    return state, time.perf_counter() - started
