"""What env ranks buy: PPO's env steps/s with a slow env (1 ms per step) in one process and
with 1, 2 and 3 env ranks under mpiexec, each ÷ one env rank under mpiexec.

Each side trains `experiments/cartpole_ppo.yaml` on `agentenv_jax.envs.slow:slow_cartpole`
(CartPole whose step sleeps `--step-ms`) with the same 8 envs split over the env ranks, for the
same budget, as a fresh job. The rate compared is `steps_per_s_after_first_update` from each
run's `summary.json` (start-up and the first compilations excluded); the whole session's rate is
printed beside it. Goals: 2 env ranks ≥ 1.7x and 3 env ranks ≥ 2.2x one env rank; one env rank
under mpiexec not slower than one process. Each side's resident memory per rank is read from
/proc while the job runs (peak of the samples).

Recorded in docs/benchmarks.md ("Current results", section 7) from the first command:

    python benchmarks/env_rank_scaling.py                 # about 2 min here
    python benchmarks/env_rank_scaling.py --repeats 3 --step-ms 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import common

CONFIG = common.EXPERIMENTS / "cartpole_ppo.yaml"
SIDES = {"1 process": 1, "1 env rank": 2, "2 env ranks": 3, "3 env ranks": 4}  # world sizes
GOALS = {"2 env ranks": 1.7, "3 env ranks": 2.2}


def run_side(world: int, args: argparse.Namespace, run_dir: Path, name: str) -> dict:
    settings = [
        "env.id=agentenv_jax.envs.slow:slow_cartpole",
        f"env.kwargs={{step_s: {args.step_ms / 1000}}}",
        "env.global_num_envs=8",
        *common.run_settings(run_dir, name, total_env_steps=args.steps),
    ]
    command = common.train_command(CONFIG, settings)
    if world > 1:
        command = common.under_mpiexec(world, command)
    peak: dict[int, float] = {}
    with common.job_environment() as env:
        process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
        while process.poll() is None:
            for pid, mb in common.rank_memory_mb(str(run_dir), world)[0].items():
                peak[pid] = max(peak.get(pid, 0.0), mb)
            time.sleep(0.5)
    if process.returncode != 0:
        raise SystemExit(f"{name} failed:\n{process.stderr.read()[-3000:]}")
    summary = json.loads((run_dir / name / "summary.json").read_text())
    memory = sorted(peak.values(), reverse=True)  # the learner holds the most
    return {
        "steady": summary["steps_per_s_after_first_update"],
        "session": summary["steps_per_s"],
        "learner_mb": memory[0] if memory else float("nan"),
        "env_rank_mb": statistics.median(memory[1:]) if len(memory) > 1 else float("nan"),
    }


def main() -> None:
    parser = common.make_parser(__doc__)
    parser.add_argument("--step-ms", type=float, default=1.0, help="sleep per env step (ms)")
    parser.add_argument("--steps", type=int, default=20_480, help="env steps per run")
    parser.add_argument("--repeats", type=int, default=1, help="runs per side (median)")
    args = parser.parse_args()
    common.require_mpiexec()
    print(f"PPO CartPole, env step + {args.step_ms} ms, 8 envs, {args.steps:,} env steps")
    print(f"{common.provenance()}\n")
    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="agentenv_env_rank_scaling_") as root:
        for repeat in range(args.repeats):
            for side, world in SIDES.items():
                run = run_side(world, args, Path(root), f"{side.replace(' ', '-')}-{repeat}")
                results[side].append(run)
                print(
                    f"  {side:<12} {run['steady']:8,.0f} steps/s after the first update "
                    f"({run['session']:,.0f} over the session)",
                    flush=True,
                )
    base = statistics.median(r["steady"] for r in results["1 env rank"])
    one_process = statistics.median(r["steady"] for r in results["1 process"])
    print()
    common.print_header(
        f"{'side':<12} | {'steps/s':>8} | {'÷ 1 env rank':>12} | {'goal':>6} | "
        f"{'learner MB':>10} | {'env rank MB':>11}"
    )
    for side, runs in results.items():
        steady = statistics.median(r["steady"] for r in runs)
        ratio = steady / base
        goal = GOALS.get(side)
        verdict = "" if goal is None else ("ok" if ratio >= goal else "MISS")
        if side == "1 env rank":  # under mpiexec -n 2, not slower than one process
            verdict = "ok" if steady >= one_process else "MISS"
        print(
            f"{side:<12} | {steady:8,.0f} | {ratio:12.2f} | {verdict:>6} | "
            f"{statistics.median(r['learner_mb'] for r in runs):10.0f} | "
            f"{statistics.median(r['env_rank_mb'] for r in runs):11.0f}"
        )
    common.save_json(args.json, results)


if __name__ == "__main__":
    main()
