"""Hundreds of env ranks on one host: 1 learner + N env ranks (one CartPole env each) start,
train and stop; how start-up, throughput and memory grow with N.

For each N of `--env-ranks` the script launches `mpiexec -n 1+N agentenv train cartpole_ppo`
with `env.global_num_envs = N` and `--updates` updates' worth of env steps, as a fresh job with
an empty compilation cache, and clocks it from the launch (`time.time()` just before it):
  - start-up: until the learner's `start` event (every rank has made its envs, agreed and
    built its role; nothing compiled yet);
  - first update: until metrics.jsonl holds its first line (the learner's first compile and
    the first round of every env rank included);
  - steps/s after the first update: summary.json's `steps_per_s_after_first_update`;
  - memory: every process's resident memory read from /proc twice a second, each process's
    peak: the ranks' total, the median and largest env rank (`env_rank_max_rss_mb` in
    summary.json, the rank's own peak, beside it), and the supervisors' total (one small
    parent process per rank, `runtime.supervisor`);
  - accounting: produced = trained and reconciles (summary.json), and how many env ranks
    imported JAX (`env_rank_jax_loaded`; the numpy policy needs none).
Every process shares this machine's cores (256 processes at N = 127 with their supervisors on 2
cores), so throughput here is what oversubscription leaves; start-up is mostly each process's
imports, paid N times over on 2 cores. "start-up / N" should stay flat (linear growth).

Recorded in docs/benchmarks.md ("Hundreds of env ranks"):

    python benchmarks/many_env_ranks.py                       # about 4 min here
    python benchmarks/many_env_ranks.py --env-ranks 7 15      # smoke run
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path

import common

from agentenv_jax.config import load_config

CONFIG = common.EXPERIMENTS / "cartpole_ppo.yaml"
RESULT_FIELDS = ("start_s", "first_update_s", "steady", "ranks_gb", "supervisors_mb")


def run_job(env_ranks: int, updates: int, root: Path) -> dict:
    """One job of 1 + `env_ranks` ranks; its clocks, memory and accounting."""
    rollout = load_config(CONFIG).algorithm.rollout_length
    name = f"n{env_ranks}"
    settings = [
        f"env.global_num_envs={env_ranks}",
        *common.run_settings(root, name, total_env_steps=env_ranks * rollout * updates),
    ]
    command = common.under_mpiexec(env_ranks + 1, common.train_command(CONFIG, settings))
    run_dir = root / name
    rank_peak: dict[int, float] = {}
    supervisor_peak: dict[int, float] = {}
    first_update_s = float("nan")
    with common.job_environment() as env:
        launched = time.time()
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        while process.poll() is None:
            ranks, supervisors = common.rank_memory_mb(str(root), env_ranks + 1)
            for peak, sample in ((rank_peak, ranks), (supervisor_peak, supervisors)):
                for pid, mb in sample.items():
                    peak[pid] = max(peak.get(pid, 0.0), mb)
            metrics = run_dir / "metrics.jsonl"
            if first_update_s != first_update_s and metrics.exists() and metrics.stat().st_size:
                first_update_s = time.time() - launched
            time.sleep(0.5)
        stderr = process.stderr.read()
    if process.returncode != 0:
        raise SystemExit(f"1 + {env_ranks} env ranks failed:\n{stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    start = next(e for e in common.read_jsonl(run_dir / "events.jsonl") if e["event"] == "start")
    accounting = summary["accounting"]
    own = summary["env_rank_max_rss_mb"]
    return {
        "env_ranks": env_ranks,
        "start_s": start["time"] - launched,
        "first_update_s": first_update_s,
        "steady": summary["steps_per_s_after_first_update"],
        "ranks_gb": sum(rank_peak.values()) / 1024,
        "env_rank_mb_median": statistics.median(own),
        "env_rank_mb_max": max(own),
        "supervisors_mb": sum(supervisor_peak.values()),
        "jax_loaded": sum(summary["env_rank_jax_loaded"]),
        "exact": accounting["reconciles"] and accounting["produced"] == accounting["trained"],
        "env_steps": summary["env_steps"],
    }


def main() -> None:
    parser = common.make_parser(__doc__, keep_runs=True)
    parser.add_argument("--env-ranks", type=int, nargs="+", default=[15, 31, 63, 127])
    parser.add_argument("--updates", type=int, default=10, help="PPO updates per job")
    args = parser.parse_args()
    common.require_mpiexec()
    print(f"PPO CartPole, 1 learner + N env ranks of 1 env each, {args.updates} updates")
    print(f"{common.provenance()}\n")
    results = []
    with common.runs_folder(args.keep_runs, "agentenv_many_env_ranks_") as root:
        for n in args.env_ranks:
            results.append(run_job(n, args.updates, root))
            print(
                f"  1 + {n} env ranks done in {results[-1]['first_update_s']:.0f} s to the "
                "first update",
                flush=True,
            )
    print()
    common.print_header(
        f"{'env ranks':>9} | {'start-up s':>10} | {'÷ N (ms)':>8} | {'1st update s':>12} | "
        f"{'steps/s':>7} | {'ranks GB':>8} | {'env rank MB':>11} | {'sup. MB':>7} | "
        f"{'JAX':>3} | accounting"
    )
    for r in results:
        per_rank_ms = 1000 * r["start_s"] / r["env_ranks"]
        print(
            f"{r['env_ranks']:>9} | {r['start_s']:10.1f} | {per_rank_ms:8.0f}"
            f" | {r['first_update_s']:12.1f} | {r['steady']:7,.0f} | {r['ranks_gb']:8.2f} | "
            f"{r['env_rank_mb_median']:5.0f}/{r['env_rank_mb_max']:<5.0f} | "
            f"{r['supervisors_mb']:7.0f} | {r['jax_loaded']:>3} | "
            f"{'exact' if r['exact'] else 'MISMATCH'} ({r['env_steps']:,} steps)"
        )
    first, last = results[0], results[-1]
    growth = (last["start_s"] / first["start_s"]) / (last["env_ranks"] / first["env_ranks"])
    print(
        f"\nstart-up growth {first['env_ranks']} -> {last['env_ranks']} env ranks, over linear: "
        f"{growth:.2f} (<= 1: no worse than linear); env rank MB: median/max of summary.json's "
        "own peaks; JAX: env ranks that imported it"
    )
    common.save_json(args.json, results)


if __name__ == "__main__":
    main()
