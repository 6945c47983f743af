"""SAC time to threshold on Pendulum-v1: one process against `mpiexec -n 3` (1 learner + 2 env
ranks, each holding half of the replay buffer).

The threshold is a mean return of at least -300 over the last 20 episodes
(`run.stop_at_return=-300`, `run.return_window=20`; the learner checks it after every update).
Both sides run `experiments/pendulum_sac.yaml` unchanged otherwise (4 envs, batch 128, one
update per env step, uniform replay of 100,000, 1,000 random steps first); the env-step budget
(`--max-steps`) caps an unsolved run.

Every run is a fresh subprocess, and the two sides take turns within each seed (the order
alternates from seed to seed). What each clock covers:

* **one process**: `agentenv_jax.runtime.launch.train(load_config(...))` over the in-process replay
  transport. Reported: `wall_s` of its `summary.json` (from the end of env and network set-up
  to the end of the run: learner construction, every jit compile, training); the whole
  `train()` call is shown beside it.
* **mpiexec -n 3**: `mpiexec -n 3 python -m agentenv_jax.workflow.cli train ...` (the `agentenv`
  command). Reported: the learner's `wall_s` from `summary.json` (from the end of the ranks'
  start-up agreement, compiles included); the job's launch-to-exit time, with three
  interpreters importing JAX on the same cores, is shown beside it.

Beside each, from the last record of `timings.jsonl` (written at the update that met the
threshold, or the last one of an unsolved run): the seconds from `learner.start()` to that
update, which leave out set-up and shutdown, and the learner's summed update and answer-wait
seconds.

The ratios are mpiexec / one process, medians over seeds, for wall time, env steps and wall
time per env step. An unsolved run counts as infinitely slow.

Recorded in docs/benchmarks.md ("Current results", section 5) from the first command (section
5's run B from the second):

    python benchmarks/sac_time_to_threshold.py                  # seed 0
    python benchmarks/sac_time_to_threshold.py --seeds 0 1
    python benchmarks/sac_time_to_threshold.py --seeds 0 1 2 --max-steps 50000
    python benchmarks/sac_time_to_threshold.py --set algorithm.samples_per_insert=64
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import common

DEFAULT_CONFIG = common.EXPERIMENTS / "pendulum_sac.yaml"
TARGET_RETURN = -300.0
RETURN_WINDOW = 20
RESULT_PREFIX = "SAC_TIME_TO_THRESHOLD_RESULT "
SIDES = ("one-process", "mpi")
LABELS = {
    "one-process": "one process (summary wall_s)",
    "mpi": "mpiexec -n 3 (learner wall_s)",
}


def overrides(args: argparse.Namespace, seed: int, run_dir: Path, name: str) -> list[str]:
    solve = {"stop_at_return": TARGET_RETURN, "return_window": RETURN_WINDOW}
    return [
        *common.run_settings(run_dir, name, seed=seed, **solve, total_env_steps=args.max_steps),
        *args.set,
    ]


def _solved(summary: dict[str, Any]) -> bool:
    mean_return = summary.get("episode_return_mean")
    return mean_return is not None and not math.isnan(mean_return) and mean_return >= TARGET_RETURN


def read_run(run_dir: Path) -> dict[str, Any]:
    """The numbers of one finished run, from its `summary.json` and the last record of its
    `timings.jsonl` (written at the update that met the threshold, or the last one)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = (run_dir / "timings.jsonl").read_text().splitlines()
    last = json.loads(lines[-1]) if lines else {}
    accounting = summary.get("accounting", {})
    return {
        "wall_s": summary["wall_s"],
        "train_s": last.get("wall_s", math.nan),  # from learner.start() to that update
        "learner_update_s": last.get("time/learner_update_s", math.nan),
        "learner_wait_s": last.get("time/learner_wait_s", math.nan),
        "env_steps": summary["env_steps"],
        "updates": summary["updates"],
        "episodes": summary["episodes"],
        "return": summary["episode_return_mean"],
        "solved": _solved(summary),
        "topology": summary.get("topology", ""),
        "reconciles": accounting.get("reconciles"),
    }


def one_process_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One single-process run in this (fresh) interpreter."""
    started = time.perf_counter()
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.runtime.launch import train

    import_s = time.perf_counter() - started
    name = f"one-seed{args.seed}"
    config = load_config(args.config, overrides(args, args.seed, args.run_dir, name))
    started = time.perf_counter()
    result = train(config)
    call_s = time.perf_counter() - started
    return read_run(result.run_dir) | {"call_s": call_s, "import_s": import_s}


def run_one_process(args: argparse.Namespace, seed: int, run_dir: Path) -> dict[str, Any]:
    worker_args = ["--seed", str(seed), "--config", str(args.config)]
    worker_args += ["--max-steps", str(args.max_steps), "--run-dir", str(run_dir)]
    return common.run_worker(
        __file__, worker_args, RESULT_PREFIX, f"one-process seed {seed}", args.timeout
    )


def run_mpi(args: argparse.Namespace, seed: int, run_dir: Path) -> dict[str, Any]:
    name = f"mpi-seed{seed}"
    job_s = common.run_agentenv_mpi(
        args.mpi_ranks,
        args.config,
        overrides(args, seed, run_dir, name),
        f"mpiexec seed {seed}",
        args.timeout,
    )
    return read_run(run_dir / name) | {"job_s": job_s}


def print_report(runs: dict[str, list[dict[str, Any]]], seeds: list[int]) -> None:
    print(f"per seed: seconds / env steps to a mean return >= {TARGET_RETURN:g} (last 20 episodes)")
    common.print_header(f"{'side':<34}" + "".join(f" | {'seed ' + str(s):>19}" for s in seeds))
    for side, side_runs in runs.items():
        cells = "".join(
            f" | {common.format_solved(common.time_to_solve(r), '8.1f'):>8} "
            f"{common.format_solved(common.steps_to_solve(r), ',.0f'):>10}"
            for r in side_runs
        )
        print(f"{LABELS[side]:<34}{cells}")
        extra, key = (
            ("  (train() call)", "call_s")
            if side == "one-process"
            else ("  (launch to exit)", "job_s")
        )
        print(f"{extra:<34}" + "".join(f" | {r[key]:>8.1f} {'':>10}" for r in side_runs))
        print(
            f"{'  (learner start to stop)':<34}"
            + "".join(f" | {r['train_s']:>8.1f} {'':>10}" for r in side_runs)
        )
        print(
            f"{'  (of which update / wait)':<34}"
            + "".join(
                f" | {r['learner_update_s']:>8.1f} {r['learner_wait_s']:>10.1f}" for r in side_runs
            )
        )

    print()
    common.print_header(
        f"{'side':<34} | {'solved':>6} | {'median s':>8} {'median steps':>12} | "
        f"{'ms/step':>7} | {'time ratio':>10} {'steps ratio':>11} {'ms/step ratio':>13}"
    )
    medians = {
        side: (
            *common.solve_medians(rs),
            common.median([1e3 * r["wall_s"] / max(r["env_steps"], 1) for r in rs]),
        )
        for side, rs in runs.items()
    }
    for side, side_runs in runs.items():
        med_time, med_steps, per_step = medians[side]
        line = (
            f"{LABELS[side]:<34} | {common.solved_cells(side_runs, med_time, med_steps)} "
            f"{per_step:>7.2f} |"
        )
        if side == "mpi" and "one-process" in medians:
            base_time, base_steps, base_per_step = medians["one-process"]
            time_ratio = med_time / base_time if math.isfinite(base_time) else math.nan
            steps_ratio = med_steps / base_steps if math.isfinite(base_steps) else math.nan
            line += f" {time_ratio:>10.2f} {steps_ratio:>11.2f} {per_step / base_per_step:>13.2f}"
        print(line)
    print(
        "\nratios: mpiexec -n 3 / one process, medians over seeds (< 1: MPI is better). "
        "ms/step: wall_s\nper env step, solved or not (episodes end every 800 env steps: 4 envs "
        "x 200 steps)."
    )


def _parser() -> argparse.ArgumentParser:
    parser = common.make_parser(
        __doc__,
        config=DEFAULT_CONFIG,
        config_help="SAC experiment YAML",
        seeds=[0],
        run_timeout=900.0,
        keep_runs=True,
        overrides=True,
    )
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument(
        "--max-steps", type=int, default=30_000, help="env-step budget (caps an unsolved run)"
    )
    parser.add_argument("--mpi-ranks", type=int, default=3, help="ranks of the MPI side")
    common.add_worker_arguments(parser)
    return parser


def main() -> None:
    args = _parser().parse_args()
    if args.worker:
        print(RESULT_PREFIX + json.dumps(one_process_worker(args)), flush=True)
        return

    print(
        f"SAC Pendulum-v1 time to a mean return >= {TARGET_RETURN:g} (last {RETURN_WINDOW} "
        f"episodes), {args.config.name}"
    )
    print(f"{common.provenance()}\nbudget {args.max_steps:,} env steps\n", flush=True)

    def run_side(side: str, seed: int, run_root: Path) -> dict[str, Any]:
        if side == "mpi":
            return run_mpi(args, seed, run_root)
        return run_one_process(args, seed, run_root)

    def describe(side: str, run: dict[str, Any]) -> str:
        return (
            f"{side:<11} {'solved' if run['solved'] else 'UNSOLVED'} in "
            f"{run['wall_s']:6.1f} s, {run['env_steps']:>7,} env steps, "
            f"{run['updates']:,} updates (return {run['return']:.1f}; accounting "
            f"{'reconciles' if run['reconciles'] else 'DOES NOT RECONCILE'})"
        )

    sides = [side for side in SIDES if side in args.sides]
    with common.runs_folder(args.keep_runs, "agentenv_sac_threshold_") as run_root:
        runs = common.run_seeds(sides, args.seeds, run_side, describe, run_root)
    print()
    print_report(runs, args.seeds)
    common.save_json(args.json, runs)


if __name__ == "__main__":
    main()
