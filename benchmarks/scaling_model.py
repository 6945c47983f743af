"""PPO scaling here: learner samples/s on 1 vs 2 processes; a throughput model vs 1-15 env ranks.

Where PPO's time goes as it scales on this machine: the learner on one or two processes, and a
simple throughput model held against measured env steps/s for 1 to 15 env ranks.

Part A, learner samples/s. The PPO update of `experiments/cartpole_ppo.yaml` (20 epochs of one
minibatch, tanh MLP) runs alone, without envs, on a synthetic CartPole-sized rollout (obs 4,
2 actions) of T x `--a-envs` envs (T: the config's 32), for each network of `--a-nets` (the
config's 64x64, and a bigger one where compute weighs more), on 4 CPU devices either way:
  side 1: one process with 4 host devices (XLA_FLAGS=--xla_force_host_platform_device_count=4),
          a mesh of the 4;
  side 2: `mpiexec -n 2`, 2 host devices per process, one global mesh of 4 (JAX's distributed
          runtime started as learners start it, gloo collectives across the processes).
Both sides are clocked the same way: after the compile and 2 warm-up updates, `--a-blocks`
blocks of `--a-updates` updates, each block from a barrier to the end of its last update; every
update puts the host rollout on the mesh and reads its metrics back, as the learner does.
samples/s = rows x updates / the median block's seconds (side 2: per block, the slower
process's clock); the ratio printed is side 2 / side 1. Each side also times an all-reduce (a
jitted sum over the mesh of a [4, n] float32 array, one row per device; median of
`--allreduce-calls` calls) of the gradient's size and of 1 float, within one process (side 1)
or across the two (side 2), and counts the collectives of its compiled update: two models of
the ratio are built from them.

Part B, scaling model vs measurement: `predict` (its docstring has the formula), from unit
costs each measured on its own in the same run:
  - env step: `slow_cartpole`'s step (sleep `--step-ms` + CartPole), in a process that sets
    its timer slack as env ranks do;
  - policy call and the CPU of a vector step: a calibration job (1 learner + 1 env rank,
    `--envs-per-rank` envs, env step 0 ms), its timings' `time/actor_inference_s` and
    `time/actor_env_step_s` / T;
  - messages + bookkeeping per round: the calibration job's round (the wall-clock between two
    updates) less its env steps, policy calls and update;
  - update: the 64x64 update on one CPU device (as these jobs' learner has), each after an idle
    pause as long as a segment's env steps, at the part B jobs' batch sizes, fitted as fixed +
    per-sample cost;
  - the update's slowdown while N env ranks wait for its parameters (the env rank's polling
    loop on the real MPI channel), N in 0 and `--env-ranks`;
  - all-reduce: part A's (the model's term for 2 learner processes; unused with one learner).
The model is held against jobs of 1 learner + N env ranks, N in `--env-ranks`, on slow_cartpole
with a fixed number of envs per env rank (`--envs-per-rank`; global_num_envs = that x N: weak
scaling), `--updates` updates each. Measured: each job's `steps_per_s_after_first_update`
(summary.json); a second table sets the model's phases beside the jobs' timings.jsonl. Every job
starts with an empty compilation cache. All share this machine's cores (at 15 env ranks, 16
processes on 2); "others' load" says how many cores other processes kept busy meanwhile.

Recorded in docs/benchmarks.md ("Learners across processes and the scaling model") from the
first command:

    python benchmarks/scaling_model.py            # about 4 min here (2 cores)
    python benchmarks/scaling_model.py --parts B --updates 60 --step-ms 2 --env-ranks 1 4 16 32
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import common
from scaling_jobs import run_part, train
from scaling_report import print_part_a, print_part_b, print_part_c
from scaling_throughput_model import UnitCosts, fit_line, predict
from scaling_workers import MESH_DEVICES, cost_worker, env_worker, learner_worker, poll_worker


def part_a(args: argparse.Namespace) -> dict[str, Any]:
    one = run_part("learner", args, 1, xla_devices=MESH_DEVICES)
    two = run_part("learner", args, 2, xla_devices=MESH_DEVICES // 2)
    rows = []
    for net, mode in ((net, mode) for net in args.a_nets for mode in args.a_gradient_sync):
        side1 = next(r for r in one if r["net"] == net and r["gradient_sync"] == mode)
        side2 = [r for r in two if r["net"] == net and r["gradient_sync"] == mode]
        per_block2 = [max(b) for b in zip(*(r["block_s"] for r in side2), strict=True)]
        update1 = common.median(side1["block_s"]) / side1["updates_per_block"]
        update2 = common.median(per_block2) / side1["updates_per_block"]
        grad1, grad2 = side1["allreduce_s"], max(r["allreduce_s"] for r in side2)
        lat1, lat2 = side1["allreduce_scalar_s"], max(r["allreduce_scalar_s"] for r in side2)
        operands = sum(side2[0]["collectives"].values())
        grad_steps = side1["grad_steps"]
        # Two models of side 2: side 1's update, plus for each gradient step the difference
        # of the gradient's all-reduce across processes and within one ("gradient only"); or
        # plus each collective operand's latency difference (a scalar all-reduce's) and each
        # gradient step's bytes (the gradient's all-reduce less the scalar's) ("collectives").
        only_gradient = update1 + grad_steps * (grad2 - grad1)
        every_collective = update1 + operands * (lat2 - lat1)
        every_collective += grad_steps * ((grad2 - lat2) - (grad1 - lat1))
        rows.append(
            {
                "net": net,
                "gradient_sync": mode,
                "params": side1["params"],
                "rows": side1["rows"],
                "grad_steps": grad_steps,
                "collectives": side2[0]["collectives"],
                "collective_operands": operands,
                "update1_s": update1,
                "update2_s": update2,
                "samples1": side1["rows"] / update1,
                "samples2": side1["rows"] / update2,
                "ratio": update1 / update2,
                "model_gradient_ratio": update1 / only_gradient,
                "model_collectives_ratio": update1 / every_collective,
                "allreduce1_s": grad1,
                "allreduce2_s": grad2,
                "latency1_s": lat1,
                "latency2_s": lat2,
                "raw": {"side1": side1, "side2": side2},
            }
        )
    return {"nets": rows, "others_cores": [one[0]["others_cores"], two[0]["others_cores"]]}


def part_b(args: argparse.Namespace, a: dict[str, Any] | None, root: Path) -> dict[str, Any]:
    env = {r["step_ms"]: r["step_s"] for r in run_part("env", args, 1)}
    costs = run_part("cost", args, 1)
    polls = run_part("poll", args, 1 + max(args.env_ranks))
    print(
        "  update with N env ranks polling (alone): "
        + ", ".join(
            f"N={p['pollers']} {p['update_s'] * 1e3:.0f} ms ({p['quiet_s'] * 1e3:.0f} ms)"
            for p in polls
        )
        + f" (others' load {polls[0]['others_cores']:.2f} cores)",
        flush=True,
    )
    fixed, per_row = fit_line([c["rows"] for c in costs], [c["update_s"] for c in costs])
    calibration = train(1, 0.0, args.calibration_updates, args, root, "calibration")
    print(
        f"  calibration (1 env rank, 0 ms env step): {calibration['steps_per_s']:,.0f} steps/s "
        f"(job {calibration['job_s']:.0f} s)",
        flush=True,
    )
    t = calibration["rollout_length"]
    # The learners' default for this update (one_psum) where part A clocked it.
    small = None
    if a:
        candidates = [r for r in a["nets"] if r["net"] == "64x64"]
        small = next((r for r in candidates if r["gradient_sync"] == "one_psum"), None)
        small = small or next(iter(candidates), None)
    units = UnitCosts(
        step_s=env[args.step_ms],
        vec_cpu_s=calibration["time/actor_env_step_s"] / t,
        policy_s=calibration["time/actor_inference_s"] / t,
        msg_s=calibration["rest_s"],
        update_fixed_s=fixed,
        update_row_s=per_row,
        pollers=[0] + [p["pollers"] for p in polls],
        slowdown=[1.0] + [p["slowdown"] for p in polls],
        allreduce_s=small["allreduce2_s"] if small else math.nan,
        latency_s=small["latency2_s"] if small else math.nan,
        collectives=small["collective_operands"] if small else 0,
        grad_steps=small["grad_steps"] if small else 0,
        cores=len(os.sched_getaffinity(0)),
    )
    runs = []
    for n in args.env_ranks:
        run = train(n, args.step_ms, args.updates, args, root, f"ranks-{n}")
        run["predicted"] = predict(n, args.envs_per_rank, run["rollout_length"], units)
        print(
            f"  {n:>2} env ranks: {run['steps_per_s']:8,.0f} steps/s measured, "
            f"{run['predicted']['steps_per_s']:8,.0f} predicted (job {run['job_s']:.0f} s, "
            f"others' load {run['others_cores']:.2f} cores)",
            flush=True,
        )
        runs.append(run)
    for n in args.two_learner_env_ranks:
        run = train(n, args.step_ms, args.updates, args, root, f"learners-2-ranks-{n}", 2)
        run["predicted"] = predict(n, args.envs_per_rank, run["rollout_length"], units, 2)
        print(
            f"  2 learners, {n:>2} env ranks: {run['steps_per_s']:8,.0f} steps/s measured, "
            f"{run['predicted']['steps_per_s']:8,.0f} predicted (job {run['job_s']:.0f} s)",
            flush=True,
        )
        runs.append(run)
    return {
        "env_step_s": env,
        "update_costs": costs,
        "polls": polls,
        "calibration": calibration,
        "units": dataclasses.asdict(units),
        "runs": runs,
    }


def _parser() -> argparse.ArgumentParser:
    parser = common.make_parser(__doc__)
    parser.add_argument(
        "--parts", default="ABC", help="which parts to run: A, B, C (C needs A and B)"
    )
    parser.add_argument("--a-nets", nargs="+", default=["64x64", "256x256"], help="part A MLPs")
    parser.add_argument("--a-envs", type=int, default=64, help="part A rollout: T x this envs")
    parser.add_argument("--a-updates", type=int, default=3, help="part A updates per block")
    parser.add_argument("--a-blocks", type=int, default=5, help="part A timed blocks (median)")
    parser.add_argument(
        "--a-gradient-sync",
        nargs="+",
        choices=["xla", "one_psum"],
        default=["xla", "one_psum"],
        help="part A's topology.gradient_sync settings, each clocked on both sides",
    )
    parser.add_argument(
        "--allreduce-calls", type=int, default=100, help="all-reduces timed (median)"
    )
    parser.add_argument(
        "--cost-envs",
        type=int,
        nargs="+",
        help="update-cost fit: rollouts of T x these envs on one device (default: the global "
        "envs of the part B jobs)",
    )
    parser.add_argument(
        "--cost-updates",
        type=int,
        default=15,
        help="updates per size of the update-cost fit, pairs per count of the polling ranks",
    )
    parser.add_argument("--step-ms", type=float, default=1.0, help="slow env: sleep per step")
    parser.add_argument("--envs-per-rank", type=int, default=4, help="envs of each env rank")
    parser.add_argument(
        "--env-ranks", type=int, nargs="+", default=[1, 2, 4, 8, 15], help="N of the part B jobs"
    )
    parser.add_argument("--updates", type=int, default=30, help="updates per part B job")
    parser.add_argument(
        "--two-learner-env-ranks",
        type=int,
        nargs="*",
        default=[2, 4],
        help="N of the part B jobs with 2 learner processes (one CPU device each)",
    )
    parser.add_argument(
        "--link-gbps", type=float, default=100.0, help="part C: the cluster's link per host"
    )
    parser.add_argument(
        "--calibration-updates", type=int, default=60, help="updates of the calibration job"
    )
    common.add_mpi_job_arguments(parser, job_timeout_s=300.0)
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = _parser().parse_args()
    if args.worker:
        work = {
            "learner": learner_worker,
            "cost": cost_worker,
            "env": env_worker,
            "poll": poll_worker,
        }[args.part]
        if args.processes > 1:
            common.run_rank_or_abort(lambda: work(args))
        else:
            work(args)
        return
    common.require_mpiexec()
    started = time.perf_counter()
    print(common.provenance())
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results: dict[str, Any] = {}
    if "A" in args.parts:
        results["A"] = part_a(args)
        print_part_a(results["A"], args)
    if "B" in args.parts:
        print("\nPart B jobs:", flush=True)
        with tempfile.TemporaryDirectory(prefix="agentenv_scaling_model_") as root:
            results["B"] = part_b(args, results.get("A"), Path(root))
        print_part_b(results["B"], args)
    if "C" in args.parts and "B" in results:
        print_part_c(results["B"], args)
    print(
        f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"whole script {time.perf_counter() - started:.0f} s"
    )
    common.save_json(args.json, results)


if __name__ == "__main__":
    main()
