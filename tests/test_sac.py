"""SAC: loss pieces on hand-computed cases, the tanh-squashed log-density against a numpy
change of variables, one jitted update step, and learning a 1-step continuous bandit.

The update tests share one set of networks and one jitted update (same shapes, same settings), so
the file compiles the update once.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentenv_jax.algorithms.sac import (
    SACHyperparams,
    SACTrainState,
    actor_loss,
    critic_loss,
    init_sac_state,
    make_sac_update,
    polyak_update,
    soft_target,
    temperature_loss,
)
from agentenv_jax.networks.sac_networks import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    SACNetworks,
    deterministic_action,
    make_sac_networks,
    sample_squashed_action,
    tanh_log_det_jacobian,
)

OBS_DIM = 3
ACTION_DIM = 2
BATCH = 128


def test_soft_target_hand_computed():
    # Row 0: 1 + 0.9 * (min(3, 2) - 0.5 * -1) = 1 + 0.9 * 2.5 = 3.25. Row 1: discount 0 -> reward.
    target = soft_target(
        next_q1=jnp.array([3.0, 1.0]),
        next_q2=jnp.array([2.0, 5.0]),
        next_log_prob=jnp.array([-1.0, 2.0]),
        alpha=0.5,
        reward=jnp.array([1.0, -0.5]),
        discount=jnp.array([0.9, 0.0]),
    )
    np.testing.assert_allclose(target, [3.25, -0.5], rtol=1e-6)


def test_critic_loss_hand_computed_with_weights():
    # Squared errors per row: (0 + 1) and (1 + 9); weighted 1 and 0.5 -> 0.5 * (1 + 5) / 2 = 1.5.
    loss = critic_loss(
        q1=jnp.array([1.0, 2.0]),
        q2=jnp.array([0.0, 4.0]),
        target=jnp.array([1.0, 1.0]),
        weights=jnp.array([1.0, 0.5]),
    )
    assert float(loss) == pytest.approx(1.5, rel=1e-6)


def test_actor_loss_hand_computed():
    # mean(0.5 * -2 - 1, 0.5 * 0 + 1) = mean(-2, 1) = -0.5
    loss = actor_loss(jnp.array([1.0, -1.0]), jnp.array([-2.0, 0.0]), 0.5)
    assert float(loss) == pytest.approx(-0.5, rel=1e-6)


def test_temperature_loss_value_and_gradient_direction():
    log_prob = jnp.array([-1.0, -3.0])  # entropy estimate 2
    # -log 2 * mean(-1 - 2, -3 - 2) = 4 log 2
    loss = temperature_loss(jnp.log(2.0), log_prob, -2.0)
    assert float(loss) == pytest.approx(4 * math.log(2.0), rel=1e-6)
    # d/d log_alpha = entropy - target_entropy: descent lowers alpha when entropy is above target
    grad_fn = jax.grad(temperature_loss)
    assert float(grad_fn(jnp.float32(0.0), log_prob, -2.0)) == pytest.approx(4.0)
    assert float(grad_fn(jnp.float32(0.0), log_prob, 3.0)) == pytest.approx(-1.0)


def test_polyak_update_moves_each_leaf_by_tau():
    target = {"w": jnp.array([0.0, 10.0]), "b": jnp.array(4.0)}
    online = {"w": jnp.array([10.0, 0.0]), "b": jnp.array(0.0)}
    out = polyak_update(target, online, 0.1)
    np.testing.assert_allclose(out["w"], [1.0, 9.0], rtol=1e-6)
    assert float(out["b"]) == pytest.approx(3.6, rel=1e-6)
    np.testing.assert_allclose(polyak_update(target, online, 1.0)["w"], online["w"])


def test_tanh_log_det_jacobian_matches_float64_and_stays_finite():
    u = np.linspace(-6.0, 6.0, 49)
    np.testing.assert_allclose(
        tanh_log_det_jacobian(jnp.asarray(u, jnp.float32)),
        np.log(1.0 - np.tanh(u) ** 2),
        rtol=1e-5,
        atol=1e-5,
    )
    # Where float32 tanh rounds to +-1 the naive form is -inf; the exact value is
    # log sech^2(u) = 2 (log 2 - |u| - log1p(e^{-2|u|})).
    big = np.array([-100.0, -30.0, 15.0, 40.0])
    expected = 2.0 * (math.log(2.0) - np.abs(big) - np.log1p(np.exp(-2.0 * np.abs(big))))
    out = np.asarray(tanh_log_det_jacobian(jnp.asarray(big, jnp.float32)))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_squashed_log_prob_matches_numpy_change_of_variables():
    rng = np.random.default_rng(10)
    mean = rng.normal(0.0, 0.5, size=(64, 3))
    log_std = rng.uniform(-1.5, 0.3, size=(64, 3))
    noise = rng.normal(size=(64, 3))
    head = np.stack([mean, log_std], axis=-2)
    action, log_prob = sample_squashed_action(
        jnp.asarray(head, jnp.float32), jnp.asarray(noise, jnp.float32)
    )

    # Reference in float64: a = tanh(u); the density of a is the Gaussian density of atanh(a)
    # times |d atanh(a) / da|, the latter by central finite differences.
    a = np.tanh(mean + np.exp(log_std) * noise)
    std = np.exp(log_std)
    gaussian = -0.5 * ((np.arctanh(a) - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    h = 1e-7
    jacobian = (np.arctanh(a + h) - np.arctanh(a - h)) / (2 * h)
    expected = np.sum(gaussian + np.log(jacobian), axis=-1)

    np.testing.assert_allclose(action, a, rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(np.asarray(action)) <= 1.0)
    np.testing.assert_allclose(log_prob, expected, rtol=1e-4, atol=1e-4)


def test_squashed_density_integrates_to_one():
    # In 1-D, evaluate the density on a fine grid of actions in (-1, 1) by choosing the noise
    # that maps to each one, then integrate over the action.
    mean, log_std = 0.4, math.log(0.8)
    grid = np.linspace(-1.0, 1.0, 20001)[1:-1]
    noise = (np.arctanh(grid) - mean) / math.exp(log_std)
    head = jnp.broadcast_to(jnp.array([[mean], [log_std]], jnp.float32), (grid.size, 2, 1))
    action, log_prob = sample_squashed_action(head, jnp.asarray(noise[:, None], jnp.float32))
    np.testing.assert_allclose(action[:, 0], grid, atol=1e-5)
    assert np.trapezoid(np.exp(np.asarray(log_prob, np.float64)), grid) == pytest.approx(
        1.0, abs=2e-3
    )


def test_deterministic_action_is_tanh_of_mean():
    head = jnp.array([[[0.3, -4.0], [0.0, 1.0]]])
    np.testing.assert_allclose(deterministic_action(head), np.tanh([[0.3, -4.0]]), rtol=1e-6)


class Setup(NamedTuple):
    nets: SACNetworks
    state: SACTrainState
    update: object  # the jitted update
    hp: SACHyperparams


@pytest.fixture(scope="module")
def setup() -> Setup:
    nets = make_sac_networks((OBS_DIM,), ACTION_DIM, (32, 32), (32, 32), "relu")
    actor_params, critic_params = nets.init(jax.random.PRNGKey(0))
    opt = optax.adam(3e-3)
    hp = SACHyperparams(tau=0.05, target_entropy=-float(ACTION_DIM))
    state = init_sac_state(actor_params, critic_params, opt, opt, opt, 0.1, jax.random.PRNGKey(1))
    update = jax.jit(make_sac_update(nets.actor_apply, nets.critic_apply, opt, opt, opt, hp))
    return Setup(nets, state, update, hp)


def random_batch(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random but well-formed transitions; half the rows are terminal (discount 0)."""
    return {
        "obs": rng.normal(size=(BATCH, OBS_DIM)).astype(np.float32),
        "action": rng.uniform(-1, 1, size=(BATCH, ACTION_DIM)).astype(np.float32),
        "reward": rng.normal(size=BATCH).astype(np.float32),
        "next_obs": rng.normal(size=(BATCH, OBS_DIM)).astype(np.float32),
        "discount": np.where(np.arange(BATCH) % 2 == 0, 0.99, 0.0).astype(np.float32),
        "weight": rng.uniform(0.2, 1.0, size=BATCH).astype(np.float32),
    }


def test_networks_shapes_clipping_and_independent_critics(setup: Setup):
    nets, state = setup.nets, setup.state
    obs = jnp.asarray(np.random.default_rng(2).normal(size=(BATCH, OBS_DIM)), jnp.float32)
    action = jnp.zeros((BATCH, ACTION_DIM), jnp.float32)
    actor_apply, critic_apply = jax.jit(nets.actor_apply), jax.jit(nets.critic_apply)
    assert actor_apply(state.actor_params, obs).shape == (BATCH, 2, ACTION_DIM)
    q = np.asarray(critic_apply(state.critic_params, obs, action))
    assert q.shape == (BATCH, 2)
    assert not np.allclose(q[:, 0], q[:, 1]), "the two critics must have their own parameters"
    # Push the log-std layer's bias far out on both sides: the head clips it.
    for bias, bound in ((1e3, LOG_STD_MAX), (-1e3, LOG_STD_MIN)):
        params = dict(state.actor_params)
        params["log_std"] = dict(params["log_std"], bias=jnp.full((ACTION_DIM,), bias))
        np.testing.assert_allclose(actor_apply(params, obs)[:, 1], bound)


@pytest.mark.slow
def test_update_step(setup: Setup):
    state, nets, tau = setup.state, setup.nets, setup.hp.tau
    batch = random_batch(np.random.default_rng(3))
    new_state, metrics, td_errors = setup.update(state, batch)

    assert int(new_state.update_count) == 1
    for name in ("actor_params", "critic_params"):
        moved = jax.tree.map(
            lambda a, b: float(jnp.abs(a - b).max()),
            getattr(state, name),
            getattr(new_state, name),
        )
        assert min(jax.tree.leaves(moved)) > 0, name
    assert float(new_state.log_alpha) != float(state.log_alpha)
    assert not np.array_equal(new_state.key, state.key)
    for name, value in metrics.items():
        assert np.isfinite(float(value)), name
    assert float(metrics["alpha"]) == pytest.approx(0.1, rel=1e-6)

    # The target critic moves exactly tau of the way toward the updated critic.
    expected_target = jax.tree.map(
        lambda t, o: t + tau * (o - t), state.target_critic_params, new_state.critic_params
    )
    for got, want in zip(
        jax.tree.leaves(new_state.target_critic_params),
        jax.tree.leaves(expected_target),
        strict=True,
    ):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    # TD errors are per row and non-negative; on terminal rows the target is the reward, so
    # they equal |mean(Q1, Q2) - reward| under the critic before the update.
    td_errors = np.asarray(td_errors)
    assert td_errors.shape == (BATCH,)
    assert np.all(td_errors >= 0)
    q = np.asarray(jax.jit(nets.critic_apply)(state.critic_params, batch["obs"], batch["action"]))
    terminal = batch["discount"] == 0
    np.testing.assert_allclose(
        td_errors[terminal],
        np.abs(q.mean(-1) - batch["reward"])[terminal],
        rtol=1e-5,
        atol=1e-6,
    )


def test_zero_weight_rows_do_not_move_the_critic(setup: Setup):
    batch = random_batch(np.random.default_rng(4))
    batch["weight"][5] = 0.0
    poisoned = {k: v.copy() for k, v in batch.items()}
    poisoned["reward"][5] = 1e4
    a, _, td_a = setup.update(setup.state, batch)
    b, _, td_b = setup.update(setup.state, poisoned)
    for x, y in zip(
        jax.tree.leaves(a.critic_params), jax.tree.leaves(b.critic_params), strict=True
    ):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    assert float(td_b[5]) > 1e3  # the row still reports its (large) TD error for its priority


def test_learns_a_one_step_continuous_bandit(setup: Setup):
    # Constant observation, discount 0, reward -|a - best|^2: the critic only has to fit a
    # quadratic and the actor to climb it. Replay actions are uniform, as from a random actor.
    best = np.array([0.5, -0.3], np.float32)
    rng = np.random.default_rng(5)
    obs = np.ones((BATCH, OBS_DIM), np.float32)
    state = setup.state
    for _ in range(400):
        action = rng.uniform(-1, 1, size=(BATCH, ACTION_DIM)).astype(np.float32)
        batch = {
            "obs": obs,
            "action": action,
            "reward": -np.sum((action - best) ** 2, axis=-1),
            "next_obs": obs,
            "discount": np.zeros(BATCH, np.float32),
            "weight": np.ones(BATCH, np.float32),
        }
        state, metrics, _ = setup.update(state, batch)
    head = jax.jit(setup.nets.actor_apply)(state.actor_params, obs)
    greedy = np.asarray(deterministic_action(head))[0]
    np.testing.assert_allclose(greedy, best, atol=0.1)
    # The learned temperature went down: entropy started far above the -2 target.
    assert float(metrics["alpha"]) < 0.1
