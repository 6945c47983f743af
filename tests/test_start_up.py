"""Start-up: the update compiles ahead of time on a thread of its own, and network parameters
are initialized with host-side orthogonal matrices."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentenv_jax.config import load_config
from agentenv_jax.learner.ahead_of_time import CompiledAhead
from agentenv_jax.networks import init_params, make_actor_critic
from agentenv_jax.networks.actor_critic import actor_critic_param_shapes
from agentenv_jax.networks.initializers import init_on_host, orthogonal_matrix
from agentenv_jax.runtime.launch import train

from conftest import EXPERIMENTS

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _double_sum(x: jax.Array, y: jax.Array) -> jax.Array:
    return 2.0 * (x + y).sum()


def test_a_program_compiled_ahead_computes_what_the_jitted_one_does():
    jitted = jax.jit(_double_sum)
    shape = jax.ShapeDtypeStruct((3, 4), jnp.float32)
    ahead = CompiledAhead(jitted, shape, shape)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert float(ahead(x, x)) == float(jitted(x, x)) == 264.0
    with pytest.raises(TypeError):  # compiled for its shapes only
        ahead(x[:2], x[:2])


def test_a_failed_compile_is_raised_by_the_first_call():
    def bad(x: jax.Array) -> jax.Array:
        return x @ jnp.ones((5, 5))  # [3, 4] @ [5, 5]: a shape error while tracing

    ahead = CompiledAhead(jax.jit(bad), jax.ShapeDtypeStruct((3, 4), jnp.float32))
    with pytest.raises(TypeError, match="dot_general"):
        ahead(np.zeros((3, 4), np.float32))


@pytest.mark.slow
@pytest.mark.parametrize(
    "experiment, overrides",
    [
        ("cartpole_ppo", ["run.total_env_steps=512", "env.global_num_envs=4"]),
        ("pendulum_sac", ["run.total_env_steps=300", "algorithm.learning_starts=200"]),
    ],
)
def test_the_update_compiles_once_on_its_own_thread(run_dir, experiment, overrides):
    compiled_on: list[str] = []

    def on_duration(event: str, duration: float, **fields: object) -> None:
        if event == _COMPILE_EVENT and fields.get("fun_name") == "jit(update)":
            compiled_on.append(threading.current_thread().name)

    config = load_config(
        EXPERIMENTS / f"{experiment}.yaml",
        [f"run.run_dir={run_dir}", "run.name=one", "run.progress=false", *overrides],
    )
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        result = train(config)
    finally:
        jax.monitoring.unregister_event_duration_listener(on_duration)
    assert result.updates > 0
    assert compiled_on == ["compile-update"]  # not on the main thread, and never again


@pytest.mark.parametrize("shape", [(4, 64), (64, 64), (64, 2), (3, 3, 4, 32)])
def test_host_orthogonal_matrices_are_orthogonal(shape):
    w = orthogonal_matrix(np.random.default_rng(7), shape, 1.5)
    assert w.shape == shape
    flat = w.reshape(-1, shape[-1])
    gram = flat.T @ flat if flat.shape[0] >= flat.shape[1] else flat @ flat.T
    np.testing.assert_allclose(gram, 1.5**2 * np.eye(len(gram)), atol=1e-10)


def test_initial_parameters_are_a_function_of_the_key_and_compile_nothing():
    module, _ = make_actor_critic("continuous", 2, 1, (64, 64), (64, 64), "tanh", -0.5)
    compiles: list[str] = []

    def on_duration(event: str, duration: float, **fields: object) -> None:
        if event == _COMPILE_EVENT:
            compiles.append(str(fields.get("fun_name")))

    key, other = jax.random.PRNGKey(0), jax.random.PRNGKey(1)
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        params = init_params(module, (4,), key)
    finally:
        jax.monitoring.unregister_event_duration_listener(on_duration)
    assert compiles == []
    jax.tree.map(np.testing.assert_array_equal, params, init_params(module, (4,), key))
    assert not np.allclose(
        params["actor_torso"]["Dense_0"]["kernel"],
        init_params(module, (4,), other)["actor_torso"]["Dense_0"]["kernel"],
    )
    hidden = params["actor_torso"]["Dense_1"]["kernel"]
    assert not np.allclose(hidden, params["critic_torso"]["Dense_1"]["kernel"])
    np.testing.assert_allclose(hidden.T @ hidden, 2.0 * np.eye(64), atol=1e-5)  # gain sqrt(2)
    head = params["Dense_0"]["kernel"]  # the policy head: scale 0.01
    np.testing.assert_allclose(head.T @ head, 1e-4 * np.eye(2), atol=1e-9)
    np.testing.assert_array_equal(params["log_std"], np.full(2, -0.5, np.float32))
    np.testing.assert_array_equal(params["actor_torso"]["Dense_0"]["bias"], np.zeros(64))
    shapes = jax.tree.map(lambda s: (s.shape, s.dtype), actor_critic_param_shapes(module, (4,)))
    assert shapes == jax.tree.map(lambda p: (p.shape, p.dtype), params)


def test_a_parameter_without_a_host_initializer_is_named():
    import flax.linen as nn

    class Plain(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            return nn.Dense(3)(x)  # flax's own initializers

    with pytest.raises(TypeError, match=r"parameter \['Dense_0'\]\['(bias|kernel)'\]"):
        init_on_host(Plain(), jax.random.PRNGKey(0), [jax.ShapeDtypeStruct((1, 2), jnp.float32)])
