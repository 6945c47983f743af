"""IMPALA over seeds: how many runs reach a return threshold within a budget, and each run's lag.

Each seed trains a config (default `experiments/cartpole_impala.yaml`) as a fresh
`mpiexec -n RANKS agentenv train` job with `topology.num_learner_ranks=LEARNERS`,
`run.stop_at_return=THRESHOLD` and `run.total_env_steps=BUDGET`, an empty compilation cache of its
own, and `--xla_force_host_platform_device_count=DEVICES` host devices per learner process (as
`tests/test_multi_learner.py` runs two learners on CPU). A seed reached the threshold when its
summary's `episode_return_mean` is at least THRESHOLD (the run stops there) within the budget.
Per seed it prints the env steps it ran, the final mean return, the mean policy lag over every
transition trained on (from `policy_lag_hist` in `metrics.jsonl`) and the largest lag; then how
many seeds reached the threshold, the most steps any of them needed, and the range of the mean
lags.

Its results are in README.md's IMPALA section (docs/benchmarks.md's table points there), from
these commands: 16 seeds with 2 learners at the shipped bound of 2, 20 seeds at a bound of 1,
8 seeds with one learner to 500:

    python benchmarks/impala_seeds.py --num-seeds 16
    python benchmarks/impala_seeds.py --num-seeds 20 --set algorithm.max_policy_lag=1
    python benchmarks/impala_seeds.py --num-seeds 8 --ranks 3 --learners 1 --threshold 500
    python benchmarks/impala_seeds.py --seeds 0 1                      # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import common

DEFAULT_CONFIG = common.EXPERIMENTS / "cartpole_impala.yaml"


def mean_lag(records: list[dict[str, Any]]) -> float:
    """The mean policy lag over every transition of the run: each update's `policy_lag_hist`
    (transitions per lag 0, 1, ...) summed over updates."""
    counts: list[int] = []
    for record in records:
        hist = record.get("policy_lag_hist", [])
        counts += [0] * (len(hist) - len(counts))
        for lag, count in enumerate(hist):
            counts[lag] += count
    total = sum(counts)
    return sum(lag * count for lag, count in enumerate(counts)) / total if total else 0.0


def run_seed(args: argparse.Namespace, seed: int, run_root: Path) -> dict[str, Any]:
    name = f"seed{seed}"
    overrides = common.run_settings(
        run_root, name, seed=seed, stop_at_return=args.threshold, total_env_steps=args.budget
    )
    overrides += [f"topology.num_learner_ranks={args.learners}", *args.set]
    # Each learner process's JAX sees this many CPU devices.
    devices = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}"}
    job_s = common.run_agentenv_mpi(
        args.ranks, args.config, overrides, f"seed {seed}", args.timeout, devices
    )
    summary = json.loads((run_root / name / "summary.json").read_text())
    records = common.read_jsonl(run_root / name / "metrics.jsonl")
    final = summary["episode_return_mean"]
    return {
        "seed": seed,
        "env_steps": summary["env_steps"],
        "return": final,
        "reached": final is not None
        and final >= args.threshold
        and summary["env_steps"] <= args.budget,
        "mean_lag": mean_lag(records),
        "max_lag": max((r.get("policy_lag_max", 0) for r in records), default=0),
        "job_s": job_s,
    }


def _return(run: dict[str, Any]) -> str:
    return "none (no episode ended)" if run["return"] is None else f"{run['return']:.1f}"


def print_report(runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    reached = [run for run in runs if run["reached"]]
    print(
        f"\n{len(reached)} of {len(runs)} seeds reached a mean return of {args.threshold:g} "
        f"within {args.budget:,} env steps",
        end="",
    )
    if reached:
        print(f" (the slowest after {max(run['env_steps'] for run in reached):,})", end="")
    print()
    missed = [run for run in runs if not run["reached"]]
    for run in missed:
        print(f"  seed {run['seed']} ended at {_return(run)} after {run['env_steps']:,} steps")
    lags = [run["mean_lag"] for run in runs]
    print(
        f"mean policy lag per seed: {min(lags):.2f}-{max(lags):.2f} "
        f"(median {statistics.median(lags):.2f}); largest lag "
        f"{max(run['max_lag'] for run in runs)}"
    )


def _parser() -> argparse.ArgumentParser:
    parser = common.make_parser(
        __doc__, config=DEFAULT_CONFIG, run_timeout=1800.0, keep_runs=True, overrides=True
    )
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=int, nargs="+", help="seeds to run")
    seeds.add_argument("--num-seeds", type=int, default=2, help="seeds 0..N-1 (default 2)")
    parser.add_argument("--ranks", type=int, default=4, help="mpiexec -n (default 4)")
    parser.add_argument("--learners", type=int, default=2, help="learner ranks (default 2)")
    parser.add_argument(
        "--devices", type=int, default=2, help="host devices per learner process (default 2)"
    )
    parser.add_argument("--threshold", type=float, default=450.0, help="mean return to reach")
    parser.add_argument("--budget", type=int, default=500_000, help="env steps per seed")
    return parser


def main() -> None:
    args = _parser().parse_args()
    seeds = args.seeds if args.seeds is not None else list(range(args.num_seeds))
    print(
        f"IMPALA over seeds {seeds}: {args.config.name}, mpiexec -n {args.ranks}, "
        f"{args.learners} learner(s) x {args.devices} host devices, overrides {args.set or 'none'}"
    )
    print(common.provenance())
    runs = []
    with common.runs_folder(args.keep_runs, "agentenv_impala_seeds_") as run_root:
        for seed in seeds:
            run = run_seed(args, seed, run_root)
            runs.append(run)
            print(
                f"  seed {seed}: {'reached' if run['reached'] else 'MISSED '} "
                f"{run['env_steps']:>9,} env steps, return {_return(run)}, "
                f"mean lag {run['mean_lag']:.2f} (max {run['max_lag']}), job {run['job_s']:.0f} s",
                flush=True,
            )
    print_report(runs, args)
    common.save_json(args.json, runs)


if __name__ == "__main__":
    main()
