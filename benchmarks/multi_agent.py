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

Recorded in docs/benchmarks.md ("Multi-agent: MAPPO and IPPO against JaxMARL") from the first
command:

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

import common
from jaxmarl_ppo import jaxmarl_hyperparameters, make_jaxmarl_train

CONFIGS = {
    "mappo": common.EXPERIMENTS / "navigation_mappo.yaml",
    "ippo": common.EXPERIMENTS / "navigation_ippo.yaml",
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


# ---------------------------------------------------------------------------------------------
# agentenv worker


def agentenv_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One single-process agentenv_jax run in this (fresh) interpreter, clocked from its launch
    (`--launched-at`); steps reported in env steps (agent steps / 3)."""
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.runtime.launch import train

    imported = time.time()
    overrides = common.run_settings(
        args.run_dir,
        f"{args.side}-seed{args.seed}",
        seed=args.seed,
        total_env_steps=args.env_steps * NUM_AGENTS,  # agent steps
        return_window=RETURN_WINDOW,
    )
    config = load_config(CONFIGS[algorithm_of(args.side)], overrides)
    result = train(config)
    ended = time.time()
    summary = json.loads((result.run_dir / "summary.json").read_text())
    # Per-update wall times count from the session's start, as `summary.wall_s` (measured as the
    # run ended, a few ms before `train` returned): anchor them at the end.
    origin = ended - summary["wall_s"] - args.launched_at
    metrics = common.read_jsonl(result.run_dir / "metrics.jsonl")
    timings = {
        t["update"]: t["wall_s"] for t in common.read_jsonl(result.run_dir / "timings.jsonl")
    }
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


# JaxMARL worker: IPPO and feed-forward MAPPO as `jaxmarl_ppo.py` re-implements them.


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
    common.print_header(
        f"{'side':<15}"
        + "".join(
            f" | {'seed ' + str(s) + ': return (logged)':>24} {'end s':>7} {'(comp)':>7} "
            f"{'target s':>8}"
            for s in seeds
        )
    )
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
    common.print_header(header)
    reference = {agentenv: jaxmarl for agentenv, jaxmarl in PAIRS}
    for side, side_runs in runs.items():
        end = common.median([r["wall_s"] for r in side_runs])
        target = common.median([r["target_s"] for r in side_runs])
        line = (
            f"{side:<15} | {common.median([r['return'] for r in side_runs]):>11.1f} | {end:>7.1f} "
            f"{common.median([r['compile_s'] for r in side_runs]):>9.1f} "
            f"{common.median([r['env_steps'] / r['wall_s'] for r in side_runs]):>11,.0f} | "
            f"{_seconds(target, '8.1f'):>8} "
            f"{_seconds(common.median([r['target_env_steps'] for r in side_runs]), ',.0f'):>9} |"
        )
        other = reference.get(side)
        if other in runs:
            other_end = common.median([r["wall_s"] for r in runs[other]])
            other_target = common.median([r["target_s"] for r in runs[other]])
            target_ratio = (
                "--"
                if math.isinf(target) or math.isinf(other_target)
                else f"{target / other_target:.2f}"
            )
            line += f" {end / other_end:>15.2f} {target_ratio:>18}"
        print(line.rstrip(" |"))


def _parser() -> argparse.ArgumentParser:
    parser = common.make_parser(
        __doc__,
        seeds=[0],
        run_timeout=1800.0,
        keep_runs=True,
        epilog="Details (what is measured, what differs between the sides): the module "
        "docstring of benchmarks/multi_agent.py.",
    )
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
    common.add_worker_arguments(parser, ["agentenv", "jaxmarl"])
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--hyperparameters", help=argparse.SUPPRESS)
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
    print(common.provenance("jaxmarl", "distrax", "mpe2", "pettingzoo"))
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
        return common.run_worker(
            __file__, worker_args, RESULT_PREFIX, f"{side} seed {seed}", args.timeout
        )

    def describe(side: str, run: dict[str, Any]) -> str:
        return (
            f"{side:<14} team return {run['return']:6.1f} after {run['env_steps']:,} env steps "
            f"in {run['wall_s']:6.1f} s (compile {run['compile_s']:.1f} s)"
        )

    with common.runs_folder(args.keep_runs, "agentenv_multi_agent_") as run_root:
        runs = common.run_seeds(sides, args.seeds, run_side, describe, run_root)
    jaxmarl_runs = [r for side in sides if side.startswith("jaxmarl") for r in runs[side]]
    if jaxmarl_runs:
        print(f"  jaxmarl {jaxmarl_runs[0]['jaxmarl_version']}, env {JAXMARL_ENV}")
    targets = add_targets(runs, args.seeds)
    print()
    print_report(runs, args.seeds, targets)
    common.save_json(args.json, runs)


if __name__ == "__main__":
    main()
