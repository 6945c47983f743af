"""Time to solve CartPole-v1: agentenv_jax against stable-baselines3, and on JAX envs against rejax.

"Solved" is a mean return of at least 475 over the last 20 episodes (rejax: over one of its
evaluations, see below). Every side uses the RL-Zoo CartPole PPO hyperparameters
(`experiments/cartpole_ppo.yaml`, `experiments/cartpole_ppo_jax.yaml`: 8 envs x 32 steps, one
minibatch of 256, 20 epochs, gamma 0.98, lambda 0.8, lr 1e-3 and clip 0.2 annealed linearly to 0
over the same budget, no entropy bonus, separate 64x64 tanh actor and critic, grad-norm 0.5), as
far as rejax takes them. Every side but rejax checks the criterion once per update (after it).

Every training run is a fresh subprocess, so each side pays its own start-up, and the sides take
turns within each seed (the order rotates from seed to seed). Every side is clocked from the
same point, the moment before its process is launched, to the end of its training call (rejax:
to its solving evaluation), and the breakdown is printed beside it:

* agentenv, one process, cold: interpreter start and imports, then the `launch.train(config)`
  call (env and network construction, every XLA compile, training, the final checkpoint and
  summary), with an empty JAX compilation cache of its own: compile time is part of the time.
* agentenv, one process, warm: the same, with the compilation cache filled by an earlier
  (untimed) run of the same config, as a user's second run finds it (the cache is on by
  default).
* agentenv, `mpiexec -n 3 agentenv train` (1 learner + 2 env ranks, 4 envs each), cold: the
  job's launch to its exit (three interpreters importing JAX on the same cores), with the
  learner's `wall_s` from `summary.json` beside it.
* stable-baselines3: interpreter start and imports (torch), building `PPO(...)` and its envs,
  and `model.learn()` (torch needs no compile).
* agentenv, JAX envs (`agentenv-jax`), cold: as the first side, with `--jax-config`
  (`env.backend: jax`: gymnax's CartPole-v1 stepped inside the learner's jit, "Anakin"; see
  docs/jax_envs.md). agentenv_jax imports JAX and gymnax inside `train()`, so on the agentenv
  sides that import is part of "construction", not of "start".
* rejax (`rejax`), cold: rejax's PPO on gymnax's CartPole-v1, which runs the whole budget as one
  jitted program: interpreter start and imports (rejax, JAX, gymnax, distrax, tfp),
  `PPO.create`, `jit(train).lower().compile()` (tracing and compiling, JAX's persistent cache
  off), and training up to the evaluation that first reaches 475 (the program goes on to the
  end of the budget; that rest is not counted).

rejax's statistic: rejax sees returns only through its evaluation callback, which runs inside
the jit every `--rejax-eval-freq` env steps and plays 128 fresh episodes with actions sampled
from the current policy (not its mode). This side sends each evaluation's env steps and mean
return to the host (`jax.debug.callback`), which notes the wall time, and takes as its solve
time and env steps those of the first evaluation whose mean is at least 475. That is not the
statistic of the other sides (the last 20 training episodes, played by the policies of the last
updates): rejax's steps are rounded up to a multiple of the evaluation period, and its time
includes the evaluations it needs to see the return. Where rejax cannot follow the config: clip
0.2 stays constant and also clips the value loss, its "max_grad_norm" 0.5 is an element-wise
`optax.clip` (not a global-norm clip), actor and critic have an Adam each (eps 1e-8, not 1e-5),
the layers start from flax's default initialization (agentenv's: orthogonal), and time-limit
truncations are not bootstrapped. rejax 0.1.3 unpacks gymnax's pre-1.0 step (5 values) and
gymnax >= 1.0 returns 6, so the env is wrapped to return `done = terminated or truncated`
(`_FiveValueStep`).

Threads: agentenv_jax runs with its defaults (XLA's CPU pool on the learner, one XLA thread on
MPI env ranks), rejax with XLA's. torch is pinned to ONE intra-op thread by default
(`--torch-threads 0` keeps torch's default, one per core): for a 64x64 MLP on a batch of 256 a
second thread buys nothing, and on a shared 2-core machine torch's default pool collapses under
contention (measured here 2-10x slower, 75-220 s instead of 20-30 s for one seed). One thread is
sb3's best setting here, which makes the comparison conservative for agentenv_jax. The thread
count used is printed.

The ratios are medians over seeds, agentenv / sb3, for wall time (goal <= 0.5 cold, <= 0.3
warm) and env steps (goal <= 1.0); rejax / sb3 is printed without a goal. The JAX-env sides are
also compared with each other, agentenv-jax / rejax: wall time from launch, compile included
(goal <= 1.0), and env steps (no goal: not the same statistic). An unsolved run counts as
infinitely slow. rejax is optional: when it is not installed its side is skipped, with a note.

Recorded in docs/benchmarks.md ("Current results", sections 3 and 7) from the first command:

    python benchmarks/time_to_solve.py                      # 3 seeds, every side
    python benchmarks/time_to_solve.py --seeds 0 1 2 3 4 --max-steps 300000
    python benchmarks/time_to_solve.py --sides agentenv sb3 # skip the MPI side
    python benchmarks/time_to_solve.py --sides agentenv-jax rejax  # the JAX-env pair
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import common
from cartpole_references import rejax_worker, require_sb3, sb3_worker

from agentenv_jax.metrics.compilation import CACHE_DIR_VARIABLE

DEFAULT_CONFIG = common.EXPERIMENTS / "cartpole_ppo.yaml"
DEFAULT_JAX_CONFIG = common.EXPERIMENTS / "cartpole_ppo_jax.yaml"
TARGET_RETURN = 475.0
RETURN_WINDOW = 20
TIME_GOALS = {"agentenv-warm": 0.3}  # time ÷ sb3; every other side: 0.5
STEPS_GOAL = 1.0
JAX_PAIR_TIME_GOAL = 1.0  # agentenv-jax time ÷ rejax time
REFERENCES = ("sb3", "rejax")  # sides compared against, with no goal of their own
RESULT_PREFIX = "TIME_TO_SOLVE_RESULT "
SIDES = ("agentenv", "agentenv-warm", "agentenv-mpi", "sb3", "agentenv-jax", "rejax")
WORKERS = {"sb3": "sb3", "rejax": "rejax"}  # every other side: the agentenv worker
RUN_SUBDIRS = {"agentenv-warm": "warm", "agentenv-jax": "jax"}  # agentenv: the run root


def agentenv_overrides(args: argparse.Namespace, seed: int, run_dir: Path, name: str) -> list[str]:
    solve = {"stop_at_return": TARGET_RETURN, "return_window": RETURN_WINDOW}
    return common.run_settings(run_dir, name, seed=seed, **solve, total_env_steps=args.max_steps)


def agentenv_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One single-process agentenv_jax run in this (fresh) interpreter, clocked from its
    launch (`--launched-at`)."""
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.runtime.launch import train

    imported = time.time()
    config = load_config(
        args.config, agentenv_overrides(args, args.seed, args.run_dir, f"seed{args.seed}")
    )
    result = train(config)
    ended = time.time()
    summary = json.loads((result.run_dir / "summary.json").read_text())
    return {
        "wall_s": ended - args.launched_at,
        "start_s": imported - args.launched_at,  # interpreter start and imports
        "train_call_s": ended - imported,
        "compile_s": summary["compile_s"],
        "compile_cache_hits": summary["compile_cache_hits"],
        "summary_wall_s": summary["wall_s"],
        "env_steps": result.env_steps,
        "updates": result.updates,
        "return": result.episode_return_mean,
        "solved": result.episode_return_mean >= TARGET_RETURN,
    }


def _run_worker(args: argparse.Namespace, side: str, seed: int, run_dir: Path) -> dict[str, Any]:
    worker = WORKERS.get(side, "agentenv")
    runs = run_dir / RUN_SUBDIRS.get(side, "")
    config = args.jax_config if side == "agentenv-jax" else args.config
    worker_args = [worker, "--seed", str(seed), "--config", str(config)]
    worker_args += ["--max-steps", str(args.max_steps), "--run-dir", str(runs)]
    worker_args += ["--torch-threads", str(args.torch_threads)]
    worker_args += ["--rejax-eval-freq", str(args.rejax_eval_freq)]
    # The warm side shares one cache, filled before the first seed (`_fill_warm_cache`).
    cache = {CACHE_DIR_VARIABLE: str(run_dir / "warm-cache")} if side == "agentenv-warm" else None
    return common.run_worker(
        __file__, worker_args, RESULT_PREFIX, f"{side} seed {seed}", args.timeout, cache
    )


def _fill_warm_cache(args: argparse.Namespace, run_dir: Path) -> None:
    """One untimed run of the config into the warm side's cache."""
    _run_worker(args, "agentenv-warm", 1000, run_dir)


def _run_mpi(args: argparse.Namespace, seed: int, run_dir: Path) -> dict[str, Any]:
    name = f"mpi-seed{seed}"
    launched = time.time()
    common.run_agentenv_mpi(
        args.mpi_ranks,
        args.config,
        agentenv_overrides(args, seed, run_dir, name),
        f"mpiexec seed {seed}",
        args.timeout,
    )
    job_s = time.time() - launched
    summary = json.loads((run_dir / name / "summary.json").read_text())
    mean_return = summary["episode_return_mean"]
    return {
        "wall_s": job_s,
        "learner_wall_s": summary["wall_s"],
        "env_steps": summary["env_steps"],
        "updates": summary["updates"],
        "return": mean_return,
        "solved": mean_return is not None and mean_return >= TARGET_RETURN,
        "topology": summary.get("topology", ""),
        "reconciles": summary.get("accounting", {}).get("reconciles"),
    }


def _breakdown(side: str, run: dict[str, Any]) -> str:
    """Where a run's seconds went, as one cell."""
    if side == "agentenv-mpi":
        return f"learner {run['learner_wall_s']:.1f}"
    if side == "sb3":
        return f"{run['start_s']:.1f}+{run['setup_s']:.1f}+{run['learn_s']:.1f}"
    if side == "rejax":
        parts = (run["start_s"], run["setup_s"], run["compile_s"], run["train_s"])
        return "+".join(f"{part:.1f}" for part in parts)
    training = run["summary_wall_s"] - run["compile_s"]
    other = run["train_call_s"] - training - run["compile_s"]
    return f"{run['start_s']:.1f}+{other:.1f}+{run['compile_s']:.1f}+{training:.1f}"


def _ratio(value: float, reference: float, width: int, goal: float | None) -> str:
    """One ratio cell, ` ratio verdict`: ok/MISS against `goal`, blank without one."""
    ratio = value / reference
    verdict = "" if goal is None else ("ok" if ratio <= goal else "MISS")
    return f" {ratio:{width}.2f} {verdict:>4}"


def print_report(runs: dict[str, list[dict[str, Any]]], seeds: list[int]) -> None:
    labels = {
        "agentenv": "agentenv 1 process, cold cache",
        "agentenv-warm": "agentenv 1 process, warm cache",
        "agentenv-mpi": "agentenv mpiexec -n 3, cold cache",
        "sb3": "stable-baselines3",
        "agentenv-jax": "agentenv JAX envs, cold cache",
        "rejax": "rejax PPO (gymnax), cold",
    }
    print(
        "per seed: seconds from launch / env steps to a mean return >= 475 over the last 20 "
        "episodes (rejax: over an evaluation's 128);\nbeside it where the seconds went: "
        "agentenv start+imports + construction and saving + compiling + training; sb3 "
        "start+imports + PPO() + learn(); rejax start+imports + PPO.create() + compiling + "
        "training to the solving evaluation"
    )
    common.print_header(f"{'side':<36}" + "".join(f" | {'seed ' + str(s):>17}" for s in seeds))
    for side, side_runs in runs.items():
        cells = "".join(
            f" | {common.format_solved(common.time_to_solve(r), '6.1f'):>8} "
            f"{common.format_solved(common.steps_to_solve(r), ',.0f'):>8}"
            for r in side_runs
        )
        print(f"{labels[side]:<36}{cells}")
        print(f"{'':<36}" + "".join(f" | {_breakdown(side, r):>17}" for r in side_runs))

    print()
    medians = {side: common.solve_medians(side_runs) for side, side_runs in runs.items()}
    jax_pair = "agentenv-jax" in runs and "rejax" in runs
    header = (
        f"{'side':<36} | {'solved':>6} | {'median s':>8} {'median steps':>12} | "
        f"{'time/sb3':>8} {'goal':>4} | {'steps/sb3':>9} {'goal':>4}"
    )
    if jax_pair:
        header += f" | {'time/rejax':>10} {'goal':>4} | {'steps/rejax':>11}"
    common.print_header(header)
    for side, side_runs in runs.items():
        med_time, med_steps = medians[side]
        line = f"{labels[side]:<36} | {common.solved_cells(side_runs, med_time, med_steps)}"
        if side != "sb3" and "sb3" in runs:
            sb3_time, sb3_steps = medians["sb3"]
            reference = side in REFERENCES
            line += _ratio(med_time, sb3_time, 8, None if reference else TIME_GOALS.get(side, 0.5))
            line += " |" + _ratio(med_steps, sb3_steps, 9, None if reference else STEPS_GOAL)
        else:
            line += " " * 31
        if jax_pair and side == "agentenv-jax":
            rejax_time, rejax_steps = medians["rejax"]
            line += " |" + _ratio(med_time, rejax_time, 10, JAX_PAIR_TIME_GOAL)
            line += " |" + _ratio(med_steps, rejax_steps, 11, None)
        print(line.rstrip())


def _parser() -> argparse.ArgumentParser:
    parser = common.make_parser(
        __doc__, config=DEFAULT_CONFIG, config_help="agentenv YAML", seeds=[0, 1, 2],
        run_timeout=900.0, keep_runs=True,
    )  # fmt: skip
    parser.add_argument(
        "--sides",
        nargs="+",
        default=list(SIDES),
        choices=SIDES,
        help="what to compare (default: every side; rejax is skipped when not installed)",
    )
    parser.add_argument(
        "--jax-config",
        type=Path,
        default=DEFAULT_JAX_CONFIG,
        help="agentenv YAML of the agentenv-jax side (env.backend: jax)",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=200_000,
        help="env-step budget (also the horizon of the lr/clip schedules)",
    )
    parser.add_argument(
        "--rejax-eval-freq",
        type=int,
        default=2048,
        help="env steps between rejax's evaluations (128 episodes each), which time its solve",
    )
    parser.add_argument("--mpi-ranks", type=int, default=3, help="ranks of the MPI side")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads for sb3 (default 1, see above; 0: torch's own default)",
    )
    common.add_worker_arguments(parser, ["agentenv", "sb3", "rejax"])
    return parser


def _torch_threads() -> str:
    try:
        import torch
    except ImportError:
        return "torch not installed"
    return f"torch's default: {torch.get_num_threads()} intra-op threads"


def main() -> None:
    args = _parser().parse_args()
    if args.worker:
        workers = {
            "agentenv": agentenv_worker,
            "sb3": lambda args: sb3_worker(args, TARGET_RETURN, RETURN_WINDOW),
            "rejax": lambda args: rejax_worker(args, TARGET_RETURN),
        }
        print(RESULT_PREFIX + json.dumps(workers[args.worker](args)), flush=True)
        return
    if "sb3" in args.sides:
        require_sb3()
    if "rejax" in args.sides and importlib.util.find_spec("rejax") is None:
        print("note: rejax is not installed (pip install rejax==0.1.3): skipping the rejax side")
        args.sides = [side for side in args.sides if side != "rejax"]
        if not args.sides:
            raise SystemExit("no side left to run")
    print(f"time to solve CartPole-v1 (mean of last {RETURN_WINDOW} returns >= {TARGET_RETURN})")
    print(
        common.provenance("torch", "stable-baselines3", "gymnax", "rejax", "distrax", "tfp-nightly")
    )
    print(f"{_torch_threads()}; budget {args.max_steps:,} env steps\n")

    def run_side(side: str, seed: int, run_root: Path) -> dict[str, Any]:
        if side == "agentenv-mpi":
            return _run_mpi(args, seed, run_root)
        return _run_worker(args, side, seed, run_root)

    def describe(side: str, run: dict[str, Any]) -> str:
        return (
            f"{side:<14} {'solved' if run['solved'] else 'UNSOLVED'} "
            f"in {run['wall_s']:6.1f} s, {run['env_steps']:>7,} env steps "
            f"(return {run['return']:.1f})"
        )

    sides = [side for side in SIDES if side in args.sides]
    with common.runs_folder(args.keep_runs, "agentenv_time_to_solve_") as run_root:
        if "agentenv-warm" in sides:
            _fill_warm_cache(args, run_root)
        runs = common.run_seeds(sides, args.seeds, run_side, describe, run_root)
    if runs.get("sb3"):
        print(f"  sb3 ran with torch.get_num_threads() = {runs['sb3'][0]['torch_threads']}")
    print()
    print_report(runs, args.seeds)
    common.save_json(args.json, runs)


if __name__ == "__main__":
    main()
