"""MAPPO and IPPO on MPE simple_spread: agentenv_jax against JaxMARL's baselines, on CPU.

Four sides, each trained for the same budget of *env steps* (one step of one env, whatever its
number of agents) on MPE's cooperative navigation task (3 agents cover 3 landmarks, shared
reward plus a collision penalty, discrete actions):

* `agentenv-mappo`, `agentenv-ippo`: `experiments/navigation_mappo.yaml` and
  `navigation_ippo.yaml` in one process (`launch.train`), on `agentenv_jax/Navigation-v0`: MPE2's
  `simple_spread_v3` dynamics and rewards in numpy, 25-step episodes. agentenv counts *agent*
  steps (3 per env step) in `run.total_env_steps` and its logs, so the budget given here is
  multiplied by 3 for it and its counts are divided by 3 in the report.
* `jaxmarl-mappo`, `jaxmarl-ippo`: JaxMARL's IPPO and MAPPO on its `MPE_simple_spread_v3` (jaxmarl
  0.2.0, its own JAX port of MPE), the whole run one jitted program as JaxMARL runs it. pip's
  jaxmarl has the envs and wrappers but not the training scripts (they live in the repository's
  `baselines/`), so this file re-implements them, in its own words, from
  `baselines/IPPO/ippo_ff_mpe.py` (IPPO: one actor-critic module with separate actor and critic
  MLPs on the agent's observation, one Adam) and `baselines/MAPPO/mappo_ff_hanabi.py` with the
  world state of `baselines/MAPPO/mappo_rnn_mpe.py` (MAPPO: an actor and a critic with an Adam
  each, the critic seeing every agent's observation joined); from them: the batching of agents
  (`NUM_ACTORS = agents x envs`, one parameter set for all agents, no agent id), GAE over
  JaxMARL's `done` (no bootstrap at the time limit), minibatches (IPPO: shuffled transitions;
  MAPPO: shuffled actors, whole rollout rows), the losses (clipped surrogate, value loss clipped
  by `CLIP_EPS`, advantages standardized per minibatch), orthogonal initialization, the
  step-wise linear learning-rate decay, and the per-update host callback they log through
  (`io_callback`, here recording returns instead of calling wandb). What differs from those
  files: feed-forward MAPPO (JaxMARL's MPE MAPPO is recurrent), and a plain-JAX categorical
  instead of distrax's (the same sampling, log-probabilities and entropy).

Hyperparameters: both JaxMARL sides take agentenv's from the same YAML (num envs 16, rollout 50,
10 epochs x 2 minibatches, gamma 0.99, lambda 0.95, clip 0.2, entropy 0.01, value coef 0.5,
grad-norm 0.5, Adam lr 1e-3 decayed linearly to 0, eps 1e-5, 64x64 tanh actor and critic),
rather than JaxMARL's published MPE configs (IPPO: lr 2.5e-4, 128-step rollouts, 4x4; MAPPO:
128 envs, GRU). What still differs, by construction of either library:

* env: JaxMARL's port integrates position before velocity (an action moves the agent one step
  later) and its episodes last 26 steps (the step counter is checked against 25 before it is
  incremented); its observation has MPE's 4 (always zero) communication slots (18 floats; agentenv's
  14). Uniformly random actions score a team return of -82.9 here (2000 episodes) and -83.3
  in agentenv's (200 episodes): the returns are on one scale. At equal env steps JaxMARL sees
  25/26 as many episodes.
* inputs: agentenv's policy sees the observation and a one-hot agent id; its MAPPO critic also
  the env's global state (positions and velocities, 18 floats), its IPPO critic what the policy
  sees. JaxMARL's policy and IPPO critic see the observation only; its MAPPO critic every
  agent's observation joined (54 floats), the same for all agents.
* learning: agentenv bootstraps the value at time-limit truncations, does not clip the value
  loss, and clips one global gradient norm over actor and critic together (JaxMARL IPPO too;
  JaxMARL MAPPO clips each network's own).

Most of the gap in team return at equal env steps comes from the time limit: JaxMARL's critics
see no time, yet its targets end at the 26th step; agentenv's bootstrap there. In one-off
variants of the JaxMARL sides (seed 0, 1M env steps; not options of this script), adding
`gamma * V(final observation)` to the reward of the step that ends an episode took MAPPO from
-59.8 to -40.2 (agentenv: -40.1) and IPPO from -58.4 to -52.6, and to -46.6 with the one-hot
agent id as well (agentenv: -41.2); without the bootstrap, the id alone changed neither
(MAPPO -61.0, IPPO -61.0), nor did removing the value clipping (-61.9, -63.0).

What is measured, per side and seed, each run a fresh subprocess (so each pays its own start-up
and compiles, with an empty compilation cache: cold) and the sides taking turns (the order
rotates with the seed); every side is clocked from the moment before its process is launched:

* team return: the sum over agents of each agent's episode return, averaged over the last 100
  episodes at the end of the budget. agentenv's `episode_return_mean` is exactly that (the sum
  over agents of each agent's mean over its last `run.return_window` = 100 episodes;
  `agent_return_mean` is the mean over agents). JaxMARL's `MPELogWrapper` logs
  `returned_episode_returns` per agent and env, each the agent's episode return times the number
  of agents ("as per the on-policy codebase"); a mean of it over agents is therefore the team
  return, which is what this script takes per finished episode (`returned_episode`) and
  averages over the last 100. "logged" shows each library's own statistic of the last update:
  agentenv's `episode_return_mean`; JaxMARL IPPO's mean of `returned_episode_returns` over the
  rollout's steps and actors (which also counts the previous episodes' values), MAPPO's over
  actors at the rollout's last step.
* end s: from launch to the end of training (agentenv: `launch.train` returning, the final
  checkpoint written; JaxMARL: the jitted program's outputs ready). Beside it the compile
  seconds: agentenv's `compile_s` (XLA compiles in the process, `summary.json`), JaxMARL's
  tracing, lowering and compiling of its program (`jit(train).lower(key).compile()`).
* target s: from launch to the first update after which the team return over the last 100
  episodes reaches the seed's common target, the worst side's final team return (so every side
  reaches it; the worst at or before its end). agentenv's update times come from its
  `timings.jsonl`, JaxMARL's from the host callback.

Ratios are of the medians over seeds, agentenv / JaxMARL for the same algorithm: time at equal
budget, time to the target. Under 1: agentenv is faster. Team returns are printed side by side
(no ratio: they are negative). The default run (4 sides, 1M env steps each, one seed) takes
about 3.5 minutes on 2 cores.

    python benchmarks/multi_agent.py                       # 1M env steps per side, seed 0
    python benchmarks/multi_agent.py --env-steps 200000 --seeds 0 1
    python benchmarks/multi_agent.py --sides agentenv-mappo jaxmarl-mappo
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from common import median, provenance, run_seeds, run_worker

REPO = Path(__file__).resolve().parent.parent
CONFIGS = {
    "mappo": REPO / "experiments" / "navigation_mappo.yaml",
    "ippo": REPO / "experiments" / "navigation_ippo.yaml",
}
SIDES = ("agentenv-mappo", "jaxmarl-mappo", "agentenv-ippo", "jaxmarl-ippo")
PAIRS = (("agentenv-mappo", "jaxmarl-mappo"), ("agentenv-ippo", "jaxmarl-ippo"))
NUM_AGENTS = 3
RETURN_WINDOW = 100  # episodes in the final team return, on every side
JAXMARL_ENV = "MPE_simple_spread_v3"
RESULT_PREFIX = "MULTI_AGENT_RESULT "


def algorithm_of(side: str) -> str:
    return side.split("-")[1]


def per_update_env_steps(config: Any) -> int:
    return config.env.global_num_envs * config.algorithm.rollout_length


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


# ---------------------------------------------------------------------------------------------
# agentenv worker


def agentenv_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One single-process agentenv_jax run in this (fresh) interpreter, clocked from its launch
    (`--launched-at`); steps reported in env steps (agent steps / 3)."""
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.runtime.launch import train

    imported = time.time()
    overrides = [
        f"run.seed={args.seed}",
        f"run.total_env_steps={args.env_steps * NUM_AGENTS}",  # agent steps
        f"run.return_window={RETURN_WINDOW}",
        f"run.run_dir={args.run_dir}",
        f"run.name={args.side}-seed{args.seed}",
        "run.progress=false",
    ]
    config = load_config(CONFIGS[algorithm_of(args.side)], overrides)
    result = train(config)
    ended = time.time()
    summary = json.loads((result.run_dir / "summary.json").read_text())
    # Per-update wall times count from the session's start, as `summary.wall_s` (measured as the
    # run ended, a few ms before `train` returned): anchor them at the end.
    origin = ended - summary["wall_s"] - args.launched_at
    metrics = _jsonl(result.run_dir / "metrics.jsonl")
    timings = {t["update"]: t["wall_s"] for t in _jsonl(result.run_dir / "timings.jsonl")}
    curve = [  # (seconds from launch, env steps, team return) once the window is full
        (origin + timings[m["update"]], m["env_steps"] // NUM_AGENTS, m["episode_return_mean"])
        for m in metrics
        if m["episodes"] >= RETURN_WINDOW * NUM_AGENTS  # agent-episodes
    ]
    return {
        "wall_s": ended - args.launched_at,
        "start_s": imported - args.launched_at,
        "compile_s": summary["compile_s"],
        "env_steps": result.env_steps // NUM_AGENTS,
        "agent_steps": result.env_steps,
        "updates": result.updates,
        "episodes": metrics[-1]["episodes"] // NUM_AGENTS,
        "return": result.episode_return_mean,
        "logged_return": metrics[-1]["episode_return_mean"],
        "agent_return": metrics[-1]["agent_return_mean"],
        "curve": curve,
    }


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------
# JaxMARL worker: IPPO (ippo_ff_mpe.py) and feed-forward MAPPO (mappo_ff_hanabi.py with
# mappo_rnn_mpe.py's world state), re-implemented (module docstring).


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


def jaxmarl_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One JaxMARL IPPO/MAPPO run in this (fresh) interpreter, clocked from its launch."""
    try:
        import jax
        import jaxmarl  # noqa: F401
        import numpy as np
    except ImportError as err:
        raise SystemExit(
            f"the JaxMARL sides need jaxmarl ({err}): pip install jaxmarl==0.2.0, or run "
            "without them in --sides"
        ) from None
    imported = time.time()
    jax.config.update("jax_enable_compilation_cache", False)  # cold, like agentenv's sides
    config = json.loads(args.hyperparameters)
    config |= {"ENV_NAME": JAXMARL_ENV, "TOTAL_TIMESTEPS": args.env_steps}
    window: collections.deque[float] = collections.deque(maxlen=RETURN_WINDOW)
    curve: list[tuple[float, int, float]] = []
    counts = {"episodes": 0, "logged": math.nan}

    def record(update: Any, team: Any, finished: Any, logged: Any) -> None:
        now = time.time()
        ended = np.asarray(team)[np.asarray(finished)]  # [T, E] -> step-major order
        window.extend(ended.tolist())
        counts["episodes"] += len(ended)
        counts["logged"] = float(logged)
        if len(window) == RETURN_WINDOW:
            steps = (int(update) + 1) * config["NUM_STEPS"] * config["NUM_ENVS"]
            curve.append((now - args.launched_at, steps, statistics.fmean(window)))

    centralised = algorithm_of(args.side) == "mappo"
    train, num_updates = make_jaxmarl_train(config, centralised, record)
    key = jax.random.PRNGKey(args.seed)
    built = time.time()
    compiled_train = jax.jit(train).lower(key).compile()
    compiled = time.time()
    jax.block_until_ready(compiled_train(key))
    ended = time.time()
    return {
        "wall_s": ended - args.launched_at,
        "start_s": imported - args.launched_at,
        "compile_s": compiled - built,
        "env_steps": num_updates * config["NUM_STEPS"] * config["NUM_ENVS"],
        "updates": num_updates,
        "episodes": counts["episodes"],
        "return": statistics.fmean(window) if window else math.nan,
        "logged_return": counts["logged"],
        "curve": curve,
        "jaxmarl_version": _version("jaxmarl"),
    }


def _version(package: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(package)


# ---------------------------------------------------------------------------------------------
# parent: launch, target, report


def time_to(run: dict[str, Any], target: float) -> tuple[float, float]:
    """Seconds from launch and env steps to the first update whose team return (over a full
    window) reaches `target`; infinite when none does."""
    return next(((t, s) for t, s, r in run["curve"] if r >= target - 1e-9), (math.inf, math.inf))


def add_targets(runs: dict[str, list[dict[str, Any]]], seeds: list[int]) -> dict[int, float]:
    """Each seed's common target (the worst side's final team return), and every run's time
    to it (`target_s`)."""
    targets = {}
    for index, seed in enumerate(seeds):
        seed_runs = [side_runs[index] for side_runs in runs.values()]
        targets[seed] = min(r["return"] for r in seed_runs)
        for run in seed_runs:
            run["target"] = targets[seed]
            run["target_s"], run["target_env_steps"] = time_to(run, targets[seed])
    return targets


def _seconds(value: float, spec: str = "7.1f") -> str:
    return "never" if math.isinf(value) else format(value, spec)


def print_report(
    runs: dict[str, list[dict[str, Any]]], seeds: list[int], targets: dict[int, float]
) -> None:
    print(
        f"per seed: team return over the last {RETURN_WINDOW} episodes at the end of the budget "
        "(logged: the library's own statistic) | seconds from launch to the end of training "
        "(compile s) | seconds from launch to the seed's target"
    )
    print("targets: " + ", ".join(f"seed {s} {t:.1f}" for s, t in targets.items()))
    header = f"{'side':<15}" + "".join(
        f" | {'seed ' + str(s) + ': return (logged)':>24} {'end s':>7} {'(comp)':>7} "
        f"{'target s':>8}"
        for s in seeds
    )
    print(header)
    print("-" * len(header))
    for side, side_runs in runs.items():
        cells = "".join(
            f" | {r['return']:>15.1f} ({r['logged_return']:>6.1f}) {r['wall_s']:>7.1f} "
            f"({r['compile_s']:>5.1f}) {_seconds(r['target_s'], '8.1f'):>8}"
            for r in side_runs
        )
        print(f"{side:<15}{cells}")

    print()
    header = (
        f"{'side':<15} | {'team return':>11} | {'end s':>7} {'compile s':>9} {'env steps/s':>11}"
        f" | {'target s':>8} {'env steps':>9} | {'end s ÷ JaxMARL':>15} {'target s ÷ JaxMARL':>18}"
    )
    print(
        f"medians over {len(seeds)} seed(s); env steps/s: the budget ÷ end s; env steps: to the "
        "target; ratios agentenv ÷ JaxMARL for the same algorithm (< 1: agentenv faster)"
    )
    print(header)
    print("-" * len(header))
    reference = {agentenv: jaxmarl for agentenv, jaxmarl in PAIRS}
    for side, side_runs in runs.items():
        end = median([r["wall_s"] for r in side_runs])
        target = median([r["target_s"] for r in side_runs])
        line = (
            f"{side:<15} | {median([r['return'] for r in side_runs]):>11.1f} | {end:>7.1f} "
            f"{median([r['compile_s'] for r in side_runs]):>9.1f} "
            f"{median([r['env_steps'] / r['wall_s'] for r in side_runs]):>11,.0f} | "
            f"{_seconds(target, '8.1f'):>8} "
            f"{_seconds(median([r['target_env_steps'] for r in side_runs]), ',.0f'):>9} |"
        )
        other = reference.get(side)
        if other in runs:
            other_end = median([r["wall_s"] for r in runs[other]])
            other_target = median([r["target_s"] for r in runs[other]])
            target_ratio = (
                "--"
                if math.isinf(target) or math.isinf(other_target)
                else f"{target / other_target:.2f}"
            )
            line += f" {end / other_end:>15.2f} {target_ratio:>18}"
        print(line.rstrip(" |"))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Details (what is measured, what differs between the sides): the module "
        "docstring of benchmarks/multi_agent.py.",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds to run")
    parser.add_argument(
        "--sides",
        nargs="+",
        default=list(SIDES),
        choices=SIDES,
        help="what to run (default: all four)",
    )
    parser.add_argument(
        "--env-steps",
        type=int,
        default=1_000_000,
        help="budget per side in env steps (agentenv: 3x as many agent steps), rounded up to "
        "whole updates (envs x rollout length)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="limit per run (s)")
    parser.add_argument("--keep-runs", type=Path, help="keep agentenv run dirs in this folder")
    parser.add_argument("--json", type=Path, help="also write every run's numbers to this file")
    parser.add_argument("--worker", choices=["agentenv", "jaxmarl"], help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--hyperparameters", help=argparse.SUPPRESS)
    parser.add_argument("--launched-at", type=float, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = _parser().parse_args()
    if args.worker:
        worker = agentenv_worker if args.worker == "agentenv" else jaxmarl_worker
        print(RESULT_PREFIX + json.dumps(worker(args)), flush=True)
        return
    from agentenv_jax.config.loading import load_config

    configs = {algorithm: load_config(path) for algorithm, path in CONFIGS.items()}
    per_update = {per_update_env_steps(c) for c in configs.values()}
    if len(per_update) != 1:
        raise SystemExit(f"the MAPPO and IPPO configs collect different batches: {per_update}")
    per_update_steps = per_update.pop()
    env_steps = math.ceil(args.env_steps / per_update_steps) * per_update_steps
    # Enough updates to finish the window's episodes on every side (26 steps each in JaxMARL).
    least = (math.ceil(RETURN_WINDOW * 26 / per_update_steps) + 1) * per_update_steps
    if env_steps < least:
        raise SystemExit(f"--env-steps must be at least {least:,}: {RETURN_WINDOW} episodes")
    sides = [side for side in SIDES if side in args.sides]
    print("MAPPO and IPPO on MPE simple_spread (3 agents, discrete): agentenv_jax vs JaxMARL")
    print(provenance("jaxmarl", "distrax", "mpe2", "pettingzoo"))
    print(
        f"budget {env_steps:,} env steps per side ({env_steps * NUM_AGENTS:,} agent steps in "
        f"agentenv's counters), {env_steps // per_update_steps:,} updates of {per_update_steps} "
        "env steps\n"
    )

    def run_side(side: str, seed: int, run_root: Path) -> dict[str, Any]:
        worker_args = ["jaxmarl" if side.startswith("jaxmarl") else "agentenv", "--side", side]
        worker_args += ["--seed", str(seed), "--env-steps", str(env_steps)]
        worker_args += ["--run-dir", str(run_root / side)]
        if side.startswith("jaxmarl"):
            hyperparameters = jaxmarl_hyperparameters(configs[algorithm_of(side)])
            worker_args += ["--hyperparameters", json.dumps(hyperparameters)]
        return run_worker(__file__, worker_args, RESULT_PREFIX, f"{side} seed {seed}", args.timeout)

    def describe(side: str, run: dict[str, Any]) -> str:
        return (
            f"{side:<14} team return {run['return']:6.1f} after {run['env_steps']:,} env steps "
            f"in {run['wall_s']:6.1f} s (compile {run['compile_s']:.1f} s)"
        )

    runs = run_seeds(sides, args.seeds, run_side, describe, args.keep_runs, "agentenv_multi_agent_")
    jaxmarl_runs = [r for side in sides if side.startswith("jaxmarl") for r in runs[side]]
    if jaxmarl_runs:
        print(f"  jaxmarl {jaxmarl_runs[0]['jaxmarl_version']}, env {JAXMARL_ENV}")
    targets = add_targets(runs, args.seeds)
    print()
    print_report(runs, args.seeds, targets)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
