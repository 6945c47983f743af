"""PPO loss pieces on hand-computed cases, distributions, and one update step."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentenv_jax.algorithms.ppo import (
    PPOHyperparams,
    TrainState,
    approx_kl,
    clipped_surrogate_loss,
    make_optimizer,
    make_ppo_update,
    masked_mean,
    standardize,
    value_loss,
)
from agentenv_jax.networks import action_distribution, init_params, make_actor_critic

from test_returns import numpy_gae


def test_masked_mean_ignores_masked_entries_and_handles_empty_mask():
    x = jnp.array([1.0, 2.0, 100.0])
    assert float(masked_mean(x, jnp.array([1, 1, 0]))) == pytest.approx(1.5)
    assert float(masked_mean(x, jnp.zeros(3))) == 0.0


def test_standardize_uses_masked_statistics():
    x = jnp.array([1.0, 3.0, 1000.0])
    out = standardize(x, jnp.array([1.0, 1.0, 0.0]))
    np.testing.assert_allclose(out[:2], [-1.0, 1.0], atol=1e-6)


def test_clipped_surrogate_hand_computed():
    # ratio 1.5 with A=+1 is clipped to 1.2 -> 1.2; ratio 0.5 with A=+2 -> min(1.0, 1.6) = 1.0;
    # ratio 1.5 with A=-1 -> min(-1.5, -1.2) = -1.5. Loss = -(1.2 + 1.0 - 1.5) / 3.
    log_ratio = jnp.log(jnp.array([1.5, 0.5, 1.5]))
    advantages = jnp.array([1.0, 2.0, -1.0])
    loss, clip_fraction = clipped_surrogate_loss(log_ratio, advantages, 0.2, jnp.ones(3))
    assert float(loss) == pytest.approx(-(1.2 + 1.0 - 1.5) / 3, rel=1e-6)
    assert float(clip_fraction) == pytest.approx(1.0)  # all three ratios lie outside [0.8, 1.2]


def test_clipped_surrogate_is_plain_policy_gradient_inside_the_clip_range():
    log_ratio = jnp.log(jnp.array([1.1, 0.9]))
    advantages = jnp.array([2.0, -1.0])
    loss, clip_fraction = clipped_surrogate_loss(log_ratio, advantages, 0.2, jnp.ones(2))
    assert float(loss) == pytest.approx(-(1.1 * 2.0 - 0.9 * 1.0) / 2, rel=1e-6)
    assert float(clip_fraction) == 0.0


def test_value_loss_plain_and_clipped():
    values, old, returns = jnp.array([2.0]), jnp.array([0.0]), jnp.array([1.0])
    assert float(value_loss(values, old, returns, None, jnp.ones(1))) == pytest.approx(0.5)
    # clipped value = 0 + clip(2, -0.5, 0.5) = 0.5 -> (0.5-1)^2 = 0.25; max(1.0, 0.25) = 1.0
    assert float(value_loss(values, old, returns, 0.5, jnp.ones(1))) == pytest.approx(0.5)
    values = jnp.array([0.9])  # unclipped error 0.01; clipped value 0.5 -> 0.25 -> max = 0.25
    assert float(value_loss(values, old, returns, 0.5, jnp.ones(1))) == pytest.approx(0.125)


def test_approx_kl_is_zero_for_equal_policies_and_positive_otherwise():
    assert float(approx_kl(jnp.zeros(4), jnp.ones(4))) == 0.0
    assert float(approx_kl(jnp.array([0.3, -0.3]), jnp.ones(2))) > 0.0


def test_categorical_log_prob_entropy_and_gumbel_sampling():
    dist = action_distribution("discrete")
    logits = jnp.log(jnp.array([[0.25, 0.75]]))
    assert float(dist.log_prob(logits, jnp.array([1]))[0]) == pytest.approx(math.log(0.75))
    expected_entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert float(dist.entropy(logits)[0]) == pytest.approx(expected_entropy, rel=1e-6)
    rng = np.random.default_rng(0)
    noise = rng.gumbel(size=(20000, 2)).astype(np.float32)
    samples = np.asarray(dist.sample(jnp.broadcast_to(logits, (20000, 2)), noise))
    assert samples.mean() == pytest.approx(0.75, abs=0.01)


def test_gaussian_log_prob_entropy_and_sampling():
    dist = action_distribution("continuous")
    mean, log_std = jnp.array([[0.5, -1.0]]), jnp.log(jnp.array([[2.0, 0.5]]))
    head = jnp.stack([mean, log_std], axis=-2)
    action = jnp.array([[1.5, -1.0]])
    expected = sum(
        -0.5 * ((a - m) / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi)
        for a, m, s in [(1.5, 0.5, 2.0), (-1.0, -1.0, 0.5)]
    )
    assert float(dist.log_prob(head, action)[0]) == pytest.approx(expected, rel=1e-6)
    expected_entropy = sum(math.log(s) + 0.5 * math.log(2 * math.pi * math.e) for s in (2, 0.5))
    assert float(dist.entropy(head)[0]) == pytest.approx(expected_entropy, rel=1e-6)
    noise = np.random.default_rng(1).standard_normal((50000, 2)).astype(np.float32)
    samples = np.asarray(dist.sample(jnp.broadcast_to(head, (50000, 2, 2)), noise))
    np.testing.assert_allclose(samples.mean(0), [0.5, -1.0], atol=0.03)
    np.testing.assert_allclose(samples.std(0), [2.0, 0.5], rtol=0.02)


def make_rollout(
    rng: np.random.Generator, t_len: int, batch: int, obs_dim: int, num_actions: int
) -> dict[str, np.ndarray]:
    """A random but well-formed discrete-action rollout."""
    return {
        "obs": rng.normal(size=(t_len, batch, obs_dim)).astype(np.float32),
        "action": rng.integers(0, num_actions, size=(t_len, batch)).astype(np.int32),
        "reward": rng.normal(size=(t_len, batch)).astype(np.float32),
        "log_prob": np.full((t_len, batch), -math.log(num_actions), np.float32),
        "value": rng.normal(size=(t_len, batch)).astype(np.float32),
        "bootstrap_value": rng.normal(size=(t_len, batch)).astype(np.float32),
        "terminated": (rng.random((t_len, batch)) < 0.05).astype(np.uint8),
        "truncated": np.zeros((t_len, batch), np.uint8),
        "valid": np.ones((t_len, batch), np.uint8),
        "last_value": rng.normal(size=batch).astype(np.float32),
        "last_obs": rng.normal(size=(batch, obs_dim)).astype(np.float32),
    }


def make_update_setup(num_minibatches: int = 2, seed: int = 0, hidden: tuple[int, ...] = (16,)):
    module, apply_fn = make_actor_critic("discrete", 3, 1, hidden, hidden, "tanh", 0.0)
    params = init_params(module, (4,), jax.random.PRNGKey(seed))
    hp = PPOHyperparams(
        num_epochs=3,
        num_minibatches=num_minibatches,
        gamma=0.99,
        gae_lambda=0.95,
        clip_eps=0.2,
        anneal_clip=False,
        value_clip_eps=None,
        vf_coef=0.5,
        ent_coef=0.01,
        normalize_advantages=True,
        num_updates=10,
    )
    optimizer = make_optimizer(3e-3, True, 10 * 3 * num_minibatches, 0.5, 1e-5)
    state = TrainState(
        params, optimizer.init(params), jnp.zeros((), jnp.int32), jax.random.PRNGKey(seed + 1)
    )
    return apply_fn, optimizer, hp, state


def written_out_ppo_loss(apply_fn, hp: PPOHyperparams, rollout: dict[str, np.ndarray]):
    """PPO's loss of a whole rollout as one minibatch, written from its definition apart from
    `make_ppo_loss`: numpy GAE (`test_returns.numpy_gae`), advantages standardized over the
    valid rows, `-mean(min(r A, clip(r, 1 - eps, 1 + eps) A))`, `0.5 mean((V - R)^2)` and the
    softmax's entropy, each a plain mean over the valid rows. Returns `loss(params) -> (total,
    terms)`."""
    advantages, returns = numpy_gae(
        rollout["reward"].astype(np.float64),
        rollout["value"].astype(np.float64),
        rollout["last_value"].astype(np.float64),
        rollout["terminated"].astype(bool),
        rollout["truncated"].astype(bool),
        rollout["bootstrap_value"].astype(np.float64),
        hp.gamma,
        hp.gae_lambda,
    )
    valid = rollout["valid"].reshape(-1).astype(bool)
    advantages, returns = advantages.reshape(-1)[valid], returns.reshape(-1)[valid]
    if hp.normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    obs = rollout["obs"].reshape(-1, rollout["obs"].shape[-1])[valid]
    action = rollout["action"].reshape(-1)[valid]
    behaviour = rollout["log_prob"].reshape(-1)[valid]

    def loss(params):
        logits, values = apply_fn(params, jnp.asarray(obs))
        log_p = jax.nn.log_softmax(logits)
        ratio = jnp.exp(log_p[jnp.arange(len(action)), action] - behaviour)
        clipped = jnp.clip(ratio, 1 - hp.clip_eps, 1 + hp.clip_eps)
        policy = -jnp.mean(jnp.minimum(ratio * advantages, clipped * advantages))
        value = 0.5 * jnp.mean((values.reshape(-1) - returns) ** 2)
        entropy = jnp.mean(-jnp.sum(jnp.exp(log_p) * log_p, axis=-1))
        total = policy + hp.vf_coef * value - hp.ent_coef * entropy
        outside = (ratio < 1 - hp.clip_eps) | (ratio > 1 + hp.clip_eps)
        terms = {
            "loss/total": total,
            "loss/policy": policy,
            "loss/value": value,
            "loss/entropy": entropy,
            "clip_fraction": jnp.mean(outside.astype(jnp.float32)),
        }
        return total, terms

    return loss


def test_one_update_is_an_sgd_step_on_the_written_out_loss():
    """One epoch of one minibatch with plain SGD: the update's parameters are `params - lr *
    grad` of PPO's loss written out apart (`written_out_ppo_loss`), and its metrics are that
    loss's terms. Behaviour log-probs are scattered so that some ratios leave the clip range,
    and a few rows are invalid."""
    apply_fn, _, hp, state = make_update_setup(num_minibatches=1, seed=2)
    hp = PPOHyperparams(**{**hp.__dict__, "num_epochs": 1})
    lr = 0.1
    optimizer = optax.sgd(lr)
    state = state.replace(opt_state=optimizer.init(state.params))
    rng = np.random.default_rng(4)
    rollout = make_rollout(rng, 8, 4, 4, 3)
    rollout["log_prob"] += rng.normal(scale=0.3, size=rollout["log_prob"].shape).astype(np.float32)
    rollout["valid"][5:, 2] = 0
    update = jax.jit(make_ppo_update(apply_fn, action_distribution("discrete"), optimizer, hp))
    new_state, metrics = update(state, rollout)

    loss = written_out_ppo_loss(apply_fn, hp, rollout)
    grads, terms = jax.grad(loss, has_aux=True)(state.params)
    expected = jax.tree.map(lambda p, g: p - lr * g, state.params, grads)
    for got, want, before in zip(
        jax.tree.leaves(new_state.params),
        jax.tree.leaves(expected),
        jax.tree.leaves(state.params),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
        assert not np.array_equal(np.asarray(got), np.asarray(before))
    for name, value in terms.items():
        np.testing.assert_allclose(float(metrics[name]), float(value), rtol=1e-5, err_msg=name)
    assert 0.1 < float(terms["clip_fraction"]) < 0.9  # the clip is exercised both ways
    grad_norm = math.sqrt(sum(float(jnp.sum(g**2)) for g in jax.tree.leaves(grads)))
    assert float(metrics["grad_norm"]) == pytest.approx(grad_norm, rel=1e-5)
    assert int(new_state.update_count) == 1 and int(metrics["trained_rows"]) == 8 * 4 - 3


def test_update_ignores_invalid_rows():
    """Rows with valid=0 (auto-reset padding) must not influence the update at all."""
    apply_fn, optimizer, hp, state = make_update_setup(num_minibatches=1)
    hp = PPOHyperparams(**{**hp.__dict__, "num_epochs": 1})
    update = jax.jit(make_ppo_update(apply_fn, action_distribution("discrete"), optimizer, hp))
    rollout = make_rollout(np.random.default_rng(3), 6, 4, 4, 3)
    rollout["valid"][2, 1] = 0
    rollout["terminated"][1, 1] = 1  # the padding row follows an episode end, as in NEXT_STEP
    poisoned = {k: v.copy() for k, v in rollout.items()}
    poisoned["obs"][2, 1] = 1e3
    poisoned["reward"][2, 1] = 1e3
    poisoned["action"][2, 1] = 2
    poisoned["value"][2, 1] = -1e3
    a, _ = update(state, rollout)
    b, _ = update(state, poisoned)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def shards_emulated(update_part, shards: int):
    """A `data_axis="data"` update run as `shards` shards on one device (`jax.vmap` with that
    axis name): shard s holds envs `[s B/S, (s+1) B/S)` of the rollout, as device s of a mesh
    does; the reference the mesh's `shard_map` is held against."""

    def run(state, rollout):
        def split(name, value):
            if name in ("last_value", "last_obs"):  # [B, ...]
                return value.reshape(shards, -1, *value.shape[1:])
            return value.reshape(value.shape[0], shards, -1, *value.shape[2:])

        parts = {name: split(name, value) for name, value in rollout.items()}
        axes = {name: 0 if name in ("last_value", "last_obs") else 1 for name in rollout}
        out = jax.vmap(update_part, in_axes=(None, axes), axis_name="data")(state, parts)
        return jax.tree.map(lambda x: x[0], out)  # every shard holds the same result

    return jax.jit(run)


def test_one_psum_update_on_one_shard_is_the_plain_update():
    """With one shard, `data_axis`'s update shuffles the same rows with the same key as the
    plain one and its statistics are the minibatch's own: the same update, up to rounding
    (the advantages' variance is taken in one pass). Invalid rows and a multi-agent-sized
    batch included."""
    apply_fn, optimizer, hp, state = make_update_setup(num_minibatches=4, seed=5)
    rollout = make_rollout(np.random.default_rng(9), 16, 8, 4, 3)
    rollout["valid"][:3, 2] = 0
    distribution = action_distribution("discrete")
    plain = jax.jit(make_ppo_update(apply_fn, distribution, optimizer, hp))
    part = make_ppo_update(apply_fn, distribution, optimizer, hp, data_axis="data")
    one = shards_emulated(part, 1)
    (s1, m1), (s2, m2) = plain(state, rollout), one(state, rollout)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
    for name, value in m1.items():
        np.testing.assert_allclose(float(m2[name]), float(value), rtol=1e-4, atol=1e-6)
    assert int(m2["trained_rows"]) == 16 * 8 - 3
    # Four shards shuffle within their own envs: a different (equally valid) update.
    four = shards_emulated(part, 4)(state, rollout)[0]
    moved = max(
        float(np.abs(np.asarray(a) - np.asarray(b)).max())
        for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(four.params), strict=True)
    )
    assert moved > 1e-6
