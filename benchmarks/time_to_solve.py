"""Time to solve CartPole-v1: agentenv_jax (one process, mpiexec -n 3) against stable-baselines3.

"Solved" is a mean return of at least 475 over the last 20 episodes. All three sides use the
RL-Zoo CartPole PPO hyperparameters (`experiments/cartpole_ppo.yaml`: 8 envs x 32 steps, one
minibatch of 256, 20 epochs, gamma 0.98, lambda 0.8, lr 1e-3 and clip 0.2 annealed linearly to 0
over the same budget, no entropy bonus, separate 64x64 tanh actor and critic, grad-norm 0.5) and
check the criterion once per update (after it, on every side).

Every training run is a fresh subprocess, so each side pays its own start-up, and the sides take
turns within each seed (the order rotates from seed to seed). Every side is clocked from the
same point, the moment before its process is launched, to the end of its training call, and
the breakdown is printed beside it:

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

Threads: agentenv_jax runs with its defaults (XLA's CPU pool on the learner, one XLA thread on
MPI env ranks). torch is pinned to ONE intra-op thread by default (`--torch-threads 0` keeps
torch's default, one per core): for a 64x64 MLP on a batch of 256 a second thread buys nothing,
and on a shared 2-core machine torch's default pool collapses under contention (measured here
2-10x slower, 75-220 s instead of 20-30 s for one seed). One thread is sb3's best setting here,
which makes the comparison conservative for agentenv_jax. The thread count used is printed.

The ratios are medians over seeds, agentenv / sb3, for wall time (goal <= 0.5 cold, <= 0.3
warm) and env steps (goal <= 1.0). An unsolved run counts as infinitely slow.

    python benchmarks/time_to_solve.py                      # 3 seeds
    python benchmarks/time_to_solve.py --seeds 0 1 2 3 4 --max-steps 300000
    python benchmarks/time_to_solve.py --sides agentenv sb3 # skip the MPI side
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    format_solved,
    median,
    run_agentenv_mpi,
    run_seeds,
    run_worker,
    steps_to_solve,
    time_to_solve,
)

from agentenv_jax.metrics.compilation import CACHE_DIR_VARIABLE

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "experiments" / "cartpole_ppo.yaml"
TARGET_RETURN = 475.0
RETURN_WINDOW = 20
TIME_GOALS = {"agentenv-warm": 0.3}  # time ÷ sb3; every other side: 0.5
STEPS_GOAL = 1.0
RESULT_PREFIX = "TIME_TO_SOLVE_RESULT "
SIDES = ("agentenv", "agentenv-warm", "agentenv-mpi", "sb3")


def agentenv_overrides(args: argparse.Namespace, seed: int, run_dir: Path, name: str) -> list[str]:
    return [
        f"run.seed={seed}",
        f"run.stop_at_return={TARGET_RETURN}",
        f"run.return_window={RETURN_WINDOW}",
        f"run.total_env_steps={args.max_steps}",
        f"run.run_dir={run_dir}",
        f"run.name={name}",
        "run.progress=false",
    ]


def agentenv_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One single-process agentenv_jax run in this (fresh) interpreter, clocked from its
    launch (`--launched-at`)."""
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.launch import train

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


def sb3_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One stable-baselines3 PPO run with the same hyperparameters, in this interpreter,
    clocked from its launch (`--launched-at`)."""
    try:
        import torch
        from stable_baselines3 import PPO
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.env_util import make_vec_env
    except ImportError as err:
        raise SystemExit(
            f"stable-baselines3 side needs torch and stable-baselines3 ({err}); install them "
            "with: pip install -e '.[bench]'  (or run with --sides agentenv agentenv-mpi)"
        ) from None
    imported = time.time()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    class StopAtReturn(BaseCallback):
        """Stops after the update whose rollout brought the mean of the last 20 episode
        returns to the target, as agentenv's learner does (its check follows each update)."""

        def __init__(self) -> None:
            super().__init__()
            self.returns: collections.deque[float] = collections.deque(maxlen=RETURN_WINDOW)
            self.solved = False

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # added by the Monitor wrapper of make_vec_env
                    self.returns.append(float(info["episode"]["r"]))
            return not self.solved  # False on the first step after the stopping update

        def _on_rollout_end(self) -> None:
            full = len(self.returns) == RETURN_WINDOW
            self.solved = full and statistics.fmean(self.returns) >= TARGET_RETURN

    def linear(initial: float):
        return lambda progress_remaining: progress_remaining * initial

    env = make_vec_env("CartPole-v1", n_envs=8, seed=args.seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        policy_kwargs={
            "net_arch": {"pi": [64, 64], "vf": [64, 64]},
            "activation_fn": torch.nn.Tanh,
        },
        device="cpu",
        seed=args.seed,
        verbose=0,
    )
    built = time.time()
    callback = StopAtReturn()
    model.learn(total_timesteps=args.max_steps, callback=callback)
    ended = time.time()
    env.close()
    mean_return = statistics.fmean(callback.returns) if callback.returns else math.nan
    return {
        "wall_s": ended - args.launched_at,
        "start_s": imported - args.launched_at,  # interpreter start and imports
        "setup_s": built - imported,
        "learn_s": ended - built,
        "env_steps": int(model.num_timesteps),
        "return": mean_return,
        "solved": callback.solved,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
    }


def _run_worker(args: argparse.Namespace, side: str, seed: int, run_dir: Path) -> dict[str, Any]:
    worker = "sb3" if side == "sb3" else "agentenv"
    runs = run_dir / "warm" if side == "agentenv-warm" else run_dir
    worker_args = [worker, "--seed", str(seed), "--config", str(args.config)]
    worker_args += ["--max-steps", str(args.max_steps), "--run-dir", str(runs)]
    worker_args += ["--torch-threads", str(args.torch_threads)]
    # The warm side shares one cache, filled before the first seed (`_fill_warm_cache`).
    cache = {CACHE_DIR_VARIABLE: str(run_dir / "warm-cache")} if side == "agentenv-warm" else None
    return run_worker(
        __file__, worker_args, RESULT_PREFIX, f"{side} seed {seed}", args.timeout, cache
    )


def _fill_warm_cache(args: argparse.Namespace, run_dir: Path) -> None:
    """One untimed run of the config into the warm side's cache."""
    _run_worker(args, "agentenv-warm", 1000, run_dir)


def _run_mpi(args: argparse.Namespace, seed: int, run_dir: Path) -> dict[str, Any]:
    name = f"mpi-seed{seed}"
    launched = time.time()
    run_agentenv_mpi(
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
    training = run["summary_wall_s"] - run["compile_s"]
    other = run["train_call_s"] - training - run["compile_s"]
    return f"{run['start_s']:.1f}+{other:.1f}+{run['compile_s']:.1f}+{training:.1f}"


def print_report(runs: dict[str, list[dict[str, Any]]], seeds: list[int]) -> None:
    labels = {
        "agentenv": "agentenv 1 process, cold cache",
        "agentenv-warm": "agentenv 1 process, warm cache",
        "agentenv-mpi": "agentenv mpiexec -n 3, cold cache",
        "sb3": "stable-baselines3",
    }
    print(
        "per seed: seconds from launch / env steps to a mean return >= 475 over the last 20 "
        "episodes;\nbeside it where the seconds went: agentenv start+imports + construction "
        "and saving + compiling + training; sb3 start+imports + PPO() + learn()"
    )
    header = f"{'side':<36}" + "".join(f" | {'seed ' + str(s):>17}" for s in seeds)
    print(header)
    print("-" * len(header))
    for side, side_runs in runs.items():
        cells = "".join(
            f" | {format_solved(time_to_solve(r), '6.1f'):>8} "
            f"{format_solved(steps_to_solve(r), ',.0f'):>8}"
            for r in side_runs
        )
        print(f"{labels[side]:<36}{cells}")
        print(f"{'':<36}" + "".join(f" | {_breakdown(side, r):>17}" for r in side_runs))

    print()
    header = (
        f"{'side':<36} | {'solved':>6} | {'median s':>8} {'median steps':>12} | "
        f"{'time/sb3':>8} {'goal':>4} | {'steps/sb3':>9} {'goal':>4}"
    )
    print(header)
    print("-" * len(header))
    sb3 = runs.get("sb3")
    sb3_time = median([time_to_solve(r) for r in sb3]) if sb3 else math.nan
    sb3_steps = median([steps_to_solve(r) for r in sb3]) if sb3 else math.nan
    for side, side_runs in runs.items():
        med_time = median([time_to_solve(r) for r in side_runs])
        med_steps = median([steps_to_solve(r) for r in side_runs])
        solved = sum(r["solved"] for r in side_runs)
        line = (
            f"{labels[side]:<36} | {solved:>2}/{len(side_runs):<3} | "
            f"{format_solved(med_time, '8.1f'):>8} {format_solved(med_steps, ',.0f'):>12} |"
        )
        if side != "sb3" and sb3:
            time_ratio, steps_ratio = med_time / sb3_time, med_steps / sb3_steps
            time_ok = time_ratio <= TIME_GOALS.get(side, 0.5)
            line += (
                f" {time_ratio:8.2f} {'ok' if time_ok else 'MISS':>4} |"
                f" {steps_ratio:9.2f} {'ok' if steps_ratio <= STEPS_GOAL else 'MISS':>4}"
            )
        print(line)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds to run")
    parser.add_argument(
        "--sides", nargs="+", default=list(SIDES), choices=SIDES, help="what to compare"
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="agentenv YAML")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=200_000,
        help="env-step budget (also the horizon of the lr/clip schedules on both sides)",
    )
    parser.add_argument("--mpi-ranks", type=int, default=3, help="ranks of the MPI side")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads for sb3 (default 1, see above; 0: torch's own default)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="limit per run (s)")
    parser.add_argument("--keep-runs", type=Path, help="keep agentenv run dirs in this folder")
    parser.add_argument("--json", type=Path, help="also write every run's numbers to this file")
    parser.add_argument("--worker", choices=["agentenv", "sb3"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--launched-at", type=float, help=argparse.SUPPRESS)
    return parser


def _versions() -> str:
    import jax

    text = f"python {sys.version.split()[0]}, jax {jax.__version__}"
    try:
        import stable_baselines3
        import torch

        text += (
            f", torch {torch.__version__} (default {torch.get_num_threads()} intra-op threads), "
            f"stable-baselines3 {stable_baselines3.__version__}"
        )
    except ImportError:
        text += ", stable-baselines3/torch not installed"
    return text


def main() -> None:
    args = _parser().parse_args()
    if args.worker:
        worker = agentenv_worker if args.worker == "agentenv" else sb3_worker
        print(RESULT_PREFIX + json.dumps(worker(args)), flush=True)
        return
    if "sb3" in args.sides:
        try:
            import stable_baselines3  # noqa: F401
            import torch  # noqa: F401
        except ImportError as err:
            raise SystemExit(
                f"the sb3 side needs torch and stable-baselines3 ({err}): pip install -e "
                "'.[bench]', or run with --sides agentenv agentenv-mpi"
            ) from None
    print(f"time to solve CartPole-v1 (mean of last {RETURN_WINDOW} returns >= {TARGET_RETURN})")
    print(f"{os.cpu_count()} CPUs, {_versions()}; budget {args.max_steps:,} env steps\n")

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
    run_root = args.keep_runs or Path(tempfile.mkdtemp(prefix="agentenv_time_to_solve_"))
    try:
        if "agentenv-warm" in sides:
            _fill_warm_cache(args, run_root)
        runs = run_seeds(sides, args.seeds, run_side, describe, run_root, "agentenv_time_to_solve_")
    finally:
        if args.keep_runs is None:
            shutil.rmtree(run_root, ignore_errors=True)
    if runs.get("sb3"):
        print(f"  sb3 ran with torch.get_num_threads() = {runs['sb3'][0]['torch_threads']}")
    print()
    print_report(runs, args.seeds)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
