"""Atari frames per second: the C++ vector env alone, an env rank acting with the CNN policy,
and the whole training loop, in one run.

Each stage is clocked the same way, from the first step after warm-up (compiling, the first
update) to the last, in agent steps times the frame skip (4): frames per second as Atari papers
count them. Stages:

  env alone     random actions on `--envs` games, `--threads` threads (EnvPool, ALE)
  env + policy  an env rank's Actor filling segments of the same games with the experiment's
                CNN policy (jitted) choosing every action, the games in one group, then in 2
                (`env.num_splits: 2`: one group steps while the policy acts for the other)
  training      `agentenv train` in one process and under `mpiexec -n 3`, steady rate

The ratio printed is training FPS / env FPS alone (goal >= 0.5, docs/benchmarks.md).

    python benchmarks/atari_fps.py                       # pong_ppo, both backends
    python benchmarks/atari_fps.py --config experiments/breakout_impala.yaml --backends ale
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from common import (
    EXPERIMENTS,
    make_parser,
    print_header,
    provenance,
    run_agentenv_mpi,
    run_job,
    run_settings,
    runs_folder,
    train_command,
)

FRAME_SKIP = 4
GOAL = 0.5


def env_alone_fps(backend: str, game_id: str, envs: int, threads: int, steps: int) -> float:
    from agentenv_jax.envs.atari import make_atari_vector_env

    env = make_atari_vector_env(game_id, backend, envs, {}, None, 4, threads)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, env.single_action_space.n, (steps + 20, envs))
    for a in actions[:20]:
        env.step(a)
    start = time.perf_counter()
    for a in actions[20:]:
        env.step(a)
    seconds = time.perf_counter() - start
    env.close()
    return steps * envs * FRAME_SKIP / seconds


def env_with_policy_fps(
    config_path: Path, backend: str, envs: int, threads: int, splits: int, segments: int
) -> float:
    """An env rank's `Actor` filling `segments` segments with the experiment's CNN policy
    (jitted, as the env rank builds it) choosing every action, its games in `splits` groups
    (`env.num_splits`: a group steps while the policy acts for the next), nothing sent: what an
    env rank produces when the learner never makes it wait."""
    import jax

    from agentenv_jax.actor.loop import Actor
    from agentenv_jax.buffers.segment_queue import on_policy_segment_spec
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.envs.factory import make_vector_env, vector_env_spaces
    from agentenv_jax.runtime.policies import actor_critic_network, jitted_policy
    from agentenv_jax.transport.messages import param_message_spec

    config = load_config(
        config_path,
        [
            f"env.vectorization={backend}",
            f"env.num_threads={threads}",
            f"env.num_splits={splits}",
            f"env.global_num_envs={envs}",
        ],
    )
    env = make_vector_env(config.env, envs)
    spaces = vector_env_spaces(config.env.id, env)
    network = actor_critic_network(config, spaces)
    policy = jitted_policy(spaces, network, [0, 0])
    params = network[0].init(jax.random.PRNGKey(0), np.zeros((1, *spaces.obs_shape), np.uint8))
    param_spec = param_message_spec(network[2].num_params, 0)
    message = param_spec.allocate()
    param_spec.views(message)["params"][:] = network[2].ravel(params["params"])
    rollout = config.algorithm.rollout_length
    spec = on_policy_segment_spec(spaces, rollout, envs)
    actor = Actor(
        env,
        spaces,
        policy,
        None,
        spec,
        param_spec,
        seed=0,
        env_offset=0,
        rollout_length=rollout,
        gamma=0.99,
        normalize_obs=False,
        normalize_reward=False,
        clip_obs=1.0,
        clip_reward=1.0,
        max_inflight_segments=1,
        max_policy_lag=0,
        timeout_s=60.0,
    )
    actor._load_params(message)
    buffer = spec.allocate()
    actor._fill_segment(spec.views(buffer))  # compiles the policy's calls
    started = time.perf_counter()
    for _ in range(segments):
        actor._fill_segment(spec.views(buffer))
    seconds = time.perf_counter() - started
    env.close()
    return segments * rollout * envs * FRAME_SKIP / seconds


def training_fps(config: Path, backend: str, ranks: int, steps: int, root: Path, timeout: float):
    name = f"{backend}-{ranks}"
    overrides = [f"env.vectorization={backend}", *run_settings(root, name, total_env_steps=steps)]
    if ranks == 1:
        run_job(train_command(config, overrides), name, timeout)
    else:
        run_agentenv_mpi(ranks, config, overrides, name, timeout)
    summary = json.loads((root / name / "summary.json").read_text())
    return summary["steps_per_s_after_first_update"] * FRAME_SKIP, summary


def main() -> None:
    parser = make_parser(
        __doc__, config=EXPERIMENTS / "pong_ppo.yaml", run_timeout=1800, keep_runs=True
    )
    parser.add_argument("--backends", nargs="+", default=["envpool", "ale"])
    parser.add_argument("--envs", type=int, default=8, help="games on the env rank (the config's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--env-steps", type=int, default=500, help="vector steps, env alone")
    parser.add_argument("--segments", type=int, default=3, help="segments, env + policy")
    parser.add_argument("--train-steps", type=int, default=8192, help="agent steps per training")
    args = parser.parse_args()
    from agentenv_jax.config.loading import load_config

    game_id = load_config(args.config).env.id
    print(f"Atari FPS, {game_id}, {args.config.name}, {args.envs} envs, {args.threads} threads")
    print(provenance("envpool", "ale-py"))
    rows = []
    with runs_folder(args.keep_runs, "atari-fps-") as root:
        for backend in args.backends:
            alone = env_alone_fps(backend, game_id, args.envs, args.threads, args.env_steps)
            acting, acting_split = (
                env_with_policy_fps(
                    args.config, backend, args.envs, args.threads, splits, args.segments
                )
                for splits in (1, 2)
            )
            one, _ = training_fps(args.config, backend, 1, args.train_steps, root, args.timeout)
            three, _ = training_fps(args.config, backend, 3, args.train_steps, root, args.timeout)
            rows.append((backend, alone, acting, acting_split, one, three))
    print()
    print_header(
        f"{'backend':8} {'env alone':>10} {'+ policy':>10} {'2 groups':>9} {'train 1 proc':>13} "
        f"{'train -n 3':>11} {'train/env (1)':>14} {'(-n 3)':>8}"
    )
    results = []
    for backend, alone, acting, acting_split, one, three in rows:
        verdict = "ok" if max(one, three) / alone >= GOAL else "MISS"
        print(
            f"{backend:8} {alone:10,.0f} {acting:10,.0f} {acting_split:9,.0f} {one:13,.0f} "
            f"{three:11,.0f} {one / alone:14.3f} {three / alone:8.3f}  goal >= {GOAL}: {verdict}"
        )
        results.append(
            {"backend": backend, "env_fps": alone, "policy_fps": acting}
            | {"policy_fps_2_groups": acting_split, "train_fps_1": one, "train_fps_3": three}
        )
    print("\nframes per second (agent steps x 4), steady: after warm-up and the first update")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
