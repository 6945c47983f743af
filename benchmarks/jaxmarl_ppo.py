"""JaxMARL's IPPO and feed-forward MAPPO on MPE, re-implemented for `multi_agent.py`.

pip's jaxmarl ships the envs and wrappers but not its repository's `baselines/` training
scripts, so this module writes them again, in its own words: IPPO from
`baselines/IPPO/ippo_ff_mpe.py`, MAPPO from `baselines/MAPPO/mappo_ff_hanabi.py` with the world
state of `baselines/MAPPO/mappo_rnn_mpe.py`. `multi_agent.py`'s docstring lists what they share
with those files and what differs from agentenv_jax's MAPPO and IPPO.
"""

from __future__ import annotations

from typing import Any


def jaxmarl_hyperparameters(config: Any) -> dict[str, Any]:
    """The JaxMARL config (its key names) that follows an agentenv experiment's."""
    algo, network = config.algorithm, config.network
    return {
        "NUM_ENVS": config.env.global_num_envs,
        "NUM_STEPS": algo.rollout_length,
        "UPDATE_EPOCHS": algo.num_epochs,
        "NUM_MINIBATCHES": algo.num_minibatches,
        "GAMMA": algo.gamma,
        "GAE_LAMBDA": algo.gae_lambda,
        "CLIP_EPS": algo.clip_eps,
        "ENT_COEF": algo.ent_coef,
        "VF_COEF": algo.vf_coef,
        "MAX_GRAD_NORM": algo.max_grad_norm,
        "LR": algo.learning_rate,
        "ANNEAL_LR": algo.lr_schedule == "linear",
        "ACTOR_HIDDEN": list(network.actor_hidden),
        "CRITIC_HIDDEN": list(network.critic_hidden),
        "ACTIVATION": network.activation,
    }


def make_jaxmarl_train(config: dict[str, Any], centralised: bool, record: Any) -> Any:
    """JaxMARL's `make_train(config)`: the env, the number of updates and `train(key)`, the
    whole run as one function to jit. After each update `record(update, team_returns [T, E],
    finished [T, E], logged)` is called on the host."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import jaxmarl
    import numpy as np
    import optax
    from flax.linen.initializers import constant, orthogonal
    from flax.training.train_state import TrainState
    from jaxmarl.wrappers.baselines import MPELogWrapper

    env = jaxmarl.make(config["ENV_NAME"])
    agents, num_agents = env.agents, env.num_agents
    num_envs, num_steps = config["NUM_ENVS"], config["NUM_STEPS"]
    num_actors = num_agents * num_envs
    num_updates = config["TOTAL_TIMESTEPS"] // num_steps // num_envs
    num_minibatches, epochs = config["NUM_MINIBATCHES"], config["UPDATE_EPOCHS"]
    obs_size = env.observation_space(agents[0]).shape[0]
    num_actions = env.action_space(agents[0]).n
    env = MPELogWrapper(env)
    activation = nn.relu if config["ACTIVATION"] == "relu" else nn.tanh

    class Mlp(nn.Module):
        hidden: tuple[int, ...]
        outputs: int
        output_scale: float

        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            for width in self.hidden:
                x = nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(x)
                x = activation(x)
            return nn.Dense(
                self.outputs, kernel_init=orthogonal(self.output_scale), bias_init=constant(0.0)
            )(x)

    actor = Mlp(tuple(config["ACTOR_HIDDEN"]), num_actions, 0.01)
    critic = Mlp(tuple(config["CRITIC_HIDDEN"]), 1, 1.0)
    critic_size = num_agents * obs_size if centralised else obs_size

    def learning_rate(count: jax.Array) -> jax.Array:
        frac = 1.0 - (count // (num_minibatches * epochs)) / num_updates
        return config["LR"] * frac

    def optimizer() -> optax.GradientTransformation:
        lr = learning_rate if config["ANNEAL_LR"] else config["LR"]
        return optax.chain(
            optax.clip_by_global_norm(config["MAX_GRAD_NORM"]), optax.adam(lr, eps=1e-5)
        )

    # IPPO: one module, one Adam over actor and critic. MAPPO: an Adam (and a norm clip) each;
    # the summed loss then gives each network the gradient of its own loss, as their two
    # `value_and_grad` calls do.
    labels = {"actor": "actor", "critic": "critic"}
    tx = (
        optax.multi_transform({"actor": optimizer(), "critic": optimizer()}, labels)
        if centralised
        else optimizer()
    )

    def batchify(per_agent: dict[str, jax.Array]) -> jax.Array:
        """`{agent: [E, ...]}` to `[N * E, ...]`, agent-major (JaxMARL's `batchify`)."""
        return jnp.stack([per_agent[a] for a in agents]).reshape((num_actors, -1))

    def critic_input(obs: dict[str, jax.Array], obs_batch: jax.Array) -> jax.Array:
        if not centralised:
            return obs_batch
        # mappo_rnn_mpe's world state: every agent's observation joined, for every agent.
        joined = jnp.concatenate([obs[a] for a in agents], axis=-1)
        return jnp.tile(joined[None], (num_agents, 1, 1)).reshape((num_actors, -1))

    def policy_value(params: Any, obs: jax.Array, state: jax.Array):
        logits = actor.apply(params["actor"], obs)
        return jax.nn.log_softmax(logits), critic.apply(params["critic"], state)[..., 0]

    def train(key: jax.Array) -> Any:
        key, actor_key, critic_key, reset_key = jax.random.split(key, 4)
        params = {
            "actor": actor.init(actor_key, jnp.zeros(obs_size)),
            "critic": critic.init(critic_key, jnp.zeros(critic_size)),
        }
        train_state = TrainState.create(apply_fn=None, params=params, tx=tx)
        obs, env_state = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))

        def env_step(carry, _):
            train_state, env_state, obs, key = carry
            key, action_key, step_key = jax.random.split(key, 3)
            obs_batch = batchify(obs)
            state_batch = critic_input(obs, obs_batch)
            log_probs, value = policy_value(train_state.params, obs_batch, state_batch)
            action = jax.random.categorical(action_key, log_probs)
            log_prob = jnp.take_along_axis(log_probs, action[:, None], -1)[:, 0]
            actions = {a: action.reshape(num_agents, num_envs)[i] for i, a in enumerate(agents)}
            step_keys = jax.random.split(step_key, num_envs)
            obs, env_state, reward, done, info = jax.vmap(env.step)(step_keys, env_state, actions)
            transition = {
                "done": batchify(done)[:, 0].astype(jnp.float32),
                "action": action,
                "value": value,
                "reward": batchify(reward)[:, 0],
                "log_prob": log_prob,
                "obs": obs_batch,
                "state": state_batch,
                "info": info,  # [E, N] each
            }
            return (train_state, env_state, obs, key), transition

        def gae(batch: dict[str, jax.Array], last_value: jax.Array):
            def backward(carry, t):
                advantage, next_value = carry
                not_done = 1.0 - t["done"]
                delta = t["reward"] + config["GAMMA"] * next_value * not_done - t["value"]
                advantage = delta + config["GAMMA"] * config["GAE_LAMBDA"] * not_done * advantage
                return (advantage, t["value"]), advantage

            steps = {k: batch[k] for k in ("done", "reward", "value")}
            init = (jnp.zeros_like(last_value), last_value)
            # Their unroll: 8 in ippo_ff_mpe, 16 in the MAPPO scripts.
            unroll = 16 if centralised else 8
            _, advantages = jax.lax.scan(backward, init, steps, reverse=True, unroll=unroll)
            return advantages, advantages + batch["value"]

        def loss_fn(params: Any, mb: dict[str, jax.Array]):
            log_probs, value = policy_value(params, mb["obs"], mb["state"])
            clip = config["CLIP_EPS"]
            clipped_value = mb["value"] + jnp.clip(value - mb["value"], -clip, clip)
            value_loss = (
                0.5
                * jnp.maximum(
                    jnp.square(value - mb["target"]), jnp.square(clipped_value - mb["target"])
                ).mean()
            )
            log_prob = jnp.take_along_axis(log_probs, mb["action"][..., None], -1)[..., 0]
            ratio = jnp.exp(log_prob - mb["log_prob"])
            adv = (mb["advantage"] - mb["advantage"].mean()) / (mb["advantage"].std() + 1e-8)
            surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip, 1.0 + clip) * adv)
            entropy = -(jnp.exp(log_probs) * log_probs).sum(-1).mean()
            return -surrogate.mean() + config["VF_COEF"] * value_loss - config["ENT_COEF"] * entropy

        def minibatches(batch: dict[str, jax.Array], key: jax.Array) -> dict[str, jax.Array]:
            if centralised:  # mappo_*: shuffle actors, keep each actor's rollout row whole
                order = jax.random.permutation(key, num_actors)
                return jax.tree.map(
                    lambda x: jnp.swapaxes(
                        jnp.take(x, order, axis=1).reshape(
                            (num_steps, num_minibatches, -1) + x.shape[2:]
                        ),
                        0,
                        1,
                    ),
                    batch,
                )
            # ippo_ff_mpe: shuffle every transition
            size = num_steps * num_actors
            order = jax.random.permutation(key, size)
            return jax.tree.map(
                lambda x: jnp.take(x.reshape((size,) + x.shape[2:]), order, axis=0).reshape(
                    (num_minibatches, -1) + x.shape[2:]
                ),
                batch,
            )

        def update(carry, update_index):
            carry, rollout = jax.lax.scan(env_step, carry, None, num_steps)
            train_state, env_state, obs, key = carry
            obs_batch = batchify(obs)
            _, last_value = policy_value(
                train_state.params, obs_batch, critic_input(obs, obs_batch)
            )
            advantages, targets = gae(rollout, last_value)
            batch = {k: rollout[k] for k in ("action", "value", "log_prob", "obs", "state")}
            batch |= {"advantage": advantages, "target": targets}

            def epoch(carry, _):
                train_state, key = carry
                key, shuffle_key = jax.random.split(key)

                def step(train_state, mb):
                    grads = jax.grad(loss_fn)(train_state.params, mb)
                    return train_state.apply_gradients(grads=grads), None

                train_state, _ = jax.lax.scan(step, train_state, minibatches(batch, shuffle_key))
                return (train_state, key), None

            (train_state, key), _ = jax.lax.scan(epoch, (train_state, key), None, epochs)
            info = rollout["info"]
            returns = info["returned_episode_returns"]  # [T, E, N]: agent return x N
            # What each baseline logs: IPPO the mean over the rollout, MAPPO over its last step.
            logged = returns[-1].mean() if centralised else returns.mean()
            jax.experimental.io_callback(
                record,
                None,
                update_index,
                returns.mean(-1),  # team return of each env's last finished episode
                info["returned_episode"][..., 0],
                logged,
                ordered=True,
            )
            return (train_state, env_state, obs, key), None

        carry = (train_state, env_state, obs, key)
        carry, _ = jax.lax.scan(update, carry, jnp.arange(num_updates))
        return carry[0].params

    return train, num_updates
