"""Learner update throughput on this machine's devices: samples/s, time per update, memory.

The learner's own update (PPO or SAC, as `Learner` and `ReplayLearner` build it: the same
optimizer, mesh, shardings and jit) runs on synthetic batches of the experiment's shapes, with
no env ranks: what the learner can consume, not what env ranks produce. The clock starts after
`--warmup` updates (compiled and cached) and stops when the last of `--updates` is finished on
the device (`block_until_ready`); samples/s = rows trained / those seconds. On GPUs, memory is
each device's peak bytes in use (`memory_stats`); CPUs report none.

Recorded in docs/benchmarks.md: its CPU figures under "GPU check" (the defaults, PPO 64x64 on
2,048 rows, and SAC on 256 rows) and the learner's own rates under "Language models on text"
(the tiny model; `--size small` for the second row):

    python benchmarks/learner_throughput.py
    python benchmarks/learner_throughput.py --algorithm sac
    python benchmarks/learner_throughput.py --algorithm token_ppo --size tiny --envs 32 \\
        --rollout 2 --context 64 --response 16 --epochs 1 --minibatches 2 --updates 5

Other shapes, e.g.:

    python benchmarks/learner_throughput.py --algorithm ppo --hidden 4096,4096,4096 \\
        --mesh data=1,model=1
    python benchmarks/learner_throughput.py --algorithm sac --batch 4096
    python benchmarks/learner_throughput.py --algorithm token_ppo --size base --envs 64 \\
        --rollout 4 --context 128 --response 32

token_ppo trains the transformer of `network.language_model.size` on random token ids (an
Arithmetic env's spaces with `--context`/`--response` lengths) and also times central
inference's call, KV-cached generation for all `--envs` contexts on the first device.

`--experiment NAME` times a shipped on-policy experiment's own update (its network, algorithm
and hyperparameters; `--envs`/`--rollout` resize its rollout, `--set KEY=VALUE` overrides
anything else), e.g. the Atari learners on random frames:

    python benchmarks/learner_throughput.py --experiment pong_ppo --envs 64 --rollout 128
    python benchmarks/learner_throughput.py --experiment breakout_impala --envs 256 \
        --rollout 20 --set env.vectorization=ale

`benchmarks/gpu_check.sh` runs these on an accelerator.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from agentenv_jax.config import load_config
from agentenv_jax.envs.factory import make_vector_env, vector_env_spaces


def env_spaces(config):
    env = make_vector_env(config.env, 1)
    try:
        return vector_env_spaces(config.env.id, env)
    finally:
        env.close()


def _random_field(rng: np.random.Generator, name: str, shape, dtype, num_actions: int):
    if name in ("valid",):
        return np.ones(shape, dtype)
    if name in ("terminated", "truncated"):
        return (rng.random(shape) < 0.01).astype(dtype)
    if name in ("action", "obs", "last_obs") and np.issubdtype(dtype, np.integer):
        return rng.integers(0, min(num_actions, 256), size=shape).astype(dtype)
    if name == "log_prob":
        return np.full(shape, -np.log(max(num_actions, 2)), dtype)
    return rng.normal(size=shape).astype(dtype)


def peak_memory_per_device() -> list[int] | None:
    stats = [d.memory_stats() for d in jax.local_devices()]
    if any(s is None for s in stats):
        return None
    return [int(s.get("peak_bytes_in_use", s.get("bytes_in_use", 0))) for s in stats]


def time_updates(step, state, batch, warmup: int, updates: int):
    for _ in range(warmup):
        state = step(state, batch)
    jax.block_until_ready(state)
    started = time.perf_counter()
    for _ in range(updates):
        state = step(state, batch)
    jax.block_until_ready(state)
    return state, time.perf_counter() - started


def synthetic_rollout(config, spaces) -> dict[str, np.ndarray]:
    """A random rollout of the shapes one update of `config` consumes (host arrays)."""
    from agentenv_jax.buffers.segment_queue import on_policy_segment_spec
    from agentenv_jax.learner.loop import rollout_shapes

    spec = on_policy_segment_spec(
        spaces, config.algorithm.rollout_length, config.env.global_num_envs
    )
    rng = np.random.default_rng(0)
    rollout = {
        name: _random_field(rng, name, s.shape, s.dtype, spaces.action_size)
        for name, s in rollout_shapes([spec]).items()
    }
    if spaces.text is not None:  # token ids: BOS-led contexts, answers ending in EOS
        rollout["obs"][..., 0] = spaces.text.bos_id
        rollout["action"][..., -1] = spaces.text.eos_id
    return rollout


def ppo_throughput(config, args) -> dict:
    """PPO's (or, on a text env, token-level PPO's) update as the learner builds it
    (`on_policy_model`: network, optimizer, update, train state), on its mesh."""
    from agentenv_jax.learner.devices import learner_devices
    from agentenv_jax.learner.loop import jit_sharded_update
    from agentenv_jax.learner.on_policy_model import on_policy_model
    from agentenv_jax.parallel.mesh import make_mesh, place_on_mesh, row_constraint
    from agentenv_jax.parallel.partitioning import check_model_axis_divides, state_shardings

    spaces = env_spaces(config)
    mesh = make_mesh(learner_devices(config), model=config.topology.model_axis)
    model = on_policy_model(config, spaces, 1000, row_constraint(mesh))
    params = model.init_params(jax.random.PRNGKey(0))
    check_model_axis_divides(params, config.topology.model_axis)
    state = jax.jit(model.train_state)(params, jax.random.PRNGKey(1))
    shardings = state_shardings(mesh, state)
    state = place_on_mesh(mesh, state, shardings)
    jitted = jit_sharded_update(model.update, mesh, shardings)
    rollout = jax.device_put(synthetic_rollout(config, spaces))
    _, seconds = time_updates(
        lambda st, b: jitted(st, b)[0], state, rollout, args.warmup, args.updates
    )
    rows = config.algorithm.rollout_length * config.env.global_num_envs
    report = _report(config, mesh, params, rows, seconds, args.updates, "ppo")
    if spaces.text is not None:
        tokens = rows * spaces.text.response_length
        report |= {
            "algorithm": "token_ppo",
            "language_model": config.network.language_model.size,
            "context_length": spaces.text.context_length,
            "response_length": spaces.text.response_length,
            "tokens_trained_per_s": tokens * args.updates / seconds,
            **_generation_throughput(config, spaces, params, args),
        }
    return report


def _generation_throughput(config, spaces, params, args) -> dict:
    """Tokens/s of central inference's call: KV-cached generation for every env at once
    (`global_num_envs` contexts) on the first device, as the server runs it."""

    from agentenv_jax.networks.text_models import language_model_for, text_generate

    text = spaces.text
    lm = language_model_for(config.network.language_model, text)
    device = jax.local_devices()[0]
    params = jax.device_put(params, device)
    batch = config.env.global_num_envs
    context = np.random.default_rng(1).integers(0, 256, (batch, text.context_length), np.int32)
    context[:, 0] = text.bos_id
    context = jax.device_put(context, device)
    call = jax.jit(text_generate(lm, text))
    keys = [jax.random.PRNGKey(i) for i in range(args.warmup + args.updates)]
    for key in keys[: args.warmup]:
        jax.block_until_ready(call(params, context, key))
    started = time.perf_counter()
    for key in keys[args.warmup :]:
        out = call(params, context, key)
    jax.block_until_ready(out)
    seconds = time.perf_counter() - started
    # Every row generates all M tokens' worth of compute (rows past their EOS are padding).
    return {
        "generation_batch": batch,
        "generated_tokens_per_s": batch * text.response_length * args.updates / seconds,
        "generation_ms": 1000 * seconds / args.updates,
    }


def sac_throughput(config, args) -> dict:
    from agentenv_jax.learner.devices import learner_devices
    from agentenv_jax.learner.replay_loop import BATCH_FIELDS
    from agentenv_jax.learner.sac_training import make_sac_training
    from agentenv_jax.parallel.mesh import make_mesh

    spaces = env_spaces(config)
    mesh = make_mesh(learner_devices(config))
    batch_size = config.algorithm.batch_size
    obs, act = spaces.obs_shape, (spaces.action_size,)
    shapes = {
        "obs": (batch_size, *obs),
        "action": (batch_size, *act),
        "reward": (batch_size,),
        "next_obs": (batch_size, *obs),
        "discount": (batch_size,),
        "weight": (batch_size,),
    }
    batch_shapes = {k: jax.ShapeDtypeStruct(v, np.float32) for k, v in shapes.items()}
    assert set(BATCH_FIELDS) <= set(batch_shapes)
    training = make_sac_training(config, spaces, mesh, batch_shapes)
    rng = np.random.default_rng(0)
    batch = {k: rng.normal(size=v).astype(np.float32) for k, v in shapes.items()}
    batch["discount"][:] = 0.99
    batch["weight"][:] = 1.0
    batch = jax.device_put(batch)
    _, seconds = time_updates(
        lambda st, b: training.update(st, b)[0],
        training.initial_state,
        batch,
        args.warmup,
        args.updates,
    )
    params = training.initial_state.actor_params, training.initial_state.critic_params
    return _report(config, mesh, params, batch_size, seconds, args.updates, "sac")


def _report(config, mesh, params, rows: int, seconds: float, updates: int, name: str) -> dict:
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    memory = peak_memory_per_device()
    return {
        "algorithm": config.algorithm.name if name == "ppo" else name,
        "env": config.env.id,
        "torso": config.network.torso,
        "hidden": list(config.network.actor_hidden),
        "parameters": count,
        "mesh": dict(mesh.shape),
        "devices": [str(d) for d in mesh.devices.flat][:4],
        "rows_per_update": rows,
        "update_ms": 1000 * seconds / updates,
        "samples_per_s": rows * updates / seconds,
        "peak_memory_mib_per_device": None if memory is None else [m / 2**20 for m in memory],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=("ppo", "token_ppo", "sac"), default="ppo")
    parser.add_argument(
        "--experiment", help="a shipped on-policy experiment (name or file): its own update"
    )
    parser.add_argument(
        "--set", action="append", default=[], help="--experiment: a config override KEY=VALUE"
    )
    parser.add_argument("--size", default="tiny", help="token_ppo: network.language_model.size")
    parser.add_argument("--context", type=int, default=64, help="token_ppo: context tokens")
    parser.add_argument("--response", type=int, default=16, help="token_ppo: response tokens")
    parser.add_argument("--hidden", default="64,64", help="actor and critic widths")
    parser.add_argument("--envs", type=int, default=64, help="PPO: global envs")
    parser.add_argument("--rollout", type=int, default=32, help="PPO: rollout length")
    parser.add_argument("--epochs", type=int, default=4, help="PPO: epochs per update")
    parser.add_argument("--minibatches", type=int, default=4, help="PPO: minibatches")
    parser.add_argument("--batch", type=int, default=256, help="SAC: batch size")
    parser.add_argument("--mesh", default="", help="topology.mesh, e.g. data=1,model=2")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--updates", type=int, default=20)
    args = parser.parse_args()

    hidden = f"[{args.hidden}]"
    mesh = "{" + ", ".join(p.replace("=", ": ") for p in args.mesh.split(",") if p) + "}"
    common = [f"network.actor_hidden={hidden}", f"network.critic_hidden={hidden}"]
    # (token_ppo takes common[2:]: the mesh, not the MLP widths)
    if args.mesh:
        common.append(f"topology.mesh={mesh}")
    if args.experiment is not None:
        config = load_config(
            args.experiment,
            [
                f"env.global_num_envs={args.envs}",
                f"algorithm.rollout_length={args.rollout}",
                *args.set,
            ],
        )
        result = ppo_throughput(config, args)
    elif args.algorithm == "ppo":
        config = load_config(
            None,
            [
                "env.id=CartPole-v1",
                f"env.global_num_envs={args.envs}",
                f"algorithm.rollout_length={args.rollout}",
                f"algorithm.num_epochs={args.epochs}",
                f"algorithm.num_minibatches={args.minibatches}",
                *common,
            ],
        )
        result = ppo_throughput(config, args)
    elif args.algorithm == "token_ppo":
        config = load_config(
            None,
            [
                "env.id=agentenv_jax/Arithmetic-v0",
                f"env.kwargs={{context_length: {args.context}, response_length: {args.response}}}",
                f"env.global_num_envs={args.envs}",
                f"algorithm.rollout_length={args.rollout}",
                f"algorithm.num_epochs={args.epochs}",
                f"algorithm.num_minibatches={args.minibatches}",
                f"network.language_model.size={args.size}",
                *common[2:],
            ],
        )
        result = ppo_throughput(config, args)
    else:
        config = load_config(
            None,
            [
                "env.id=Pendulum-v1",
                "algorithm.name=sac",
                f"algorithm.batch_size={args.batch}",
                "network.activation=relu",
                *common,
            ],
        )
        result = sac_throughput(config, args)
    print("RESULT " + json.dumps(result), flush=True)
    memory = result["peak_memory_mib_per_device"]
    memory_text = "n/a" if memory is None else f"{max(memory):,.0f} MiB"
    if "tokens_trained_per_s" in result:
        print(
            f"token_ppo {result['language_model']} ({result['parameters']:,} params), mesh "
            f"{result['mesh']}: {result['tokens_trained_per_s']:,.0f} tokens trained/s "
            f"({result['update_ms']:.1f} ms per update of {result['rows_per_update']} messages), "
            f"{result['generated_tokens_per_s']:,.0f} tokens generated/s (batch "
            f"{result['generation_batch']}, {result['generation_ms']:.1f} ms per call), "
            f"peak memory per device {memory_text}"
        )
        return
    network = (
        f"hidden {result['hidden']}" if result["torso"] in ("auto", "mlp") else result["torso"]
    )
    print(
        f"{result['algorithm']} on {result['env']}, {network} ({result['parameters']:,} params), "
        f"mesh {result['mesh']}: {result['samples_per_s']:,.0f} samples/s, "
        f"{result['update_ms']:.2f} ms per update of {result['rows_per_update']} rows, "
        f"peak memory per device {memory_text}"
    )


if __name__ == "__main__":
    main()
