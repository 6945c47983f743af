"""`scaling_model.py`'s report: parts A and B as Markdown tables."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from typing import Any

from scaling_throughput_model import Cluster, UnitCosts, bottleneck_shifts, project
from scaling_update import WARMUP_UPDATES, rollout_length


def print_table(columns: list[str], aligns: str, rows: Iterable[list[str]]) -> None:
    """A Markdown table: its header of `columns`, each aligned by its letter in `aligns` (`l`
    left, `r` right), and its rows of formatted cells."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---:" if align == "r" else "---" for align in aligns) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def print_part_a(a: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"\n## A. Learner samples/s: 1 process x 4 devices vs 2 processes x 2 devices\n\n"
        f"PPO update alone (cartpole_ppo: 20 epochs x 1 minibatch), rollout "
        f"{rollout_length()} x {args.a_envs} envs, median of {args.a_blocks} blocks of "
        f"{args.a_updates} updates after {WARMUP_UPDATES} warm-up updates.\n"
    )
    print_table(
        [
            "network", "gradient_sync", "params", "rows/update", "side 1 samples/s",
            "side 2 samples/s", "side 2 ÷ side 1 (goal ≥ 0.8)", "model ÷, gradient only",
            "model ÷, collectives",
        ],
        "llrrrrrrr",
        (
            [
                r["net"], r["gradient_sync"], f"{r['params']:,}", f"{r['rows']:,}",
                f"{r['samples1']:,.0f}", f"{r['samples2']:,.0f}",
                f"{r['ratio']:.2f} {'ok' if r['ratio'] >= 0.8 else 'MISS'}",
                f"{r['model_gradient_ratio']:.2f}", f"{r['model_collectives_ratio']:.2f}",
            ]
            for r in a["nets"]
        ),
    )  # fmt: skip
    by_mode = {(r["net"], r["gradient_sync"]): r for r in a["nets"]}
    nets = list(dict.fromkeys(r["net"] for r in a["nets"]))
    if all((net, mode) in by_mode for net in nets for mode in ("xla", "one_psum")):
        print()
        print_table(
            ["network", "one_psum ÷ xla, 1 process", "one_psum ÷ xla, 2 processes"],
            "lrr",
            (
                [
                    net,
                    f"{by_mode[net, 'one_psum']['samples1'] / by_mode[net, 'xla']['samples1']:.2f}",
                    f"{by_mode[net, 'one_psum']['samples2'] / by_mode[net, 'xla']['samples2']:.2f}",
                ]
                for net in nets
            ),
        )
    print()
    print_table(
        [
            "network",
            "gradient_sync",
            "collectives per update (side 2, from the compiled program)",
            "all-reduce of the gradient, 1 proc / 2 procs (µs)",
            "all-reduce of 1 float, 1 proc / 2 procs (µs)",
        ],
        "lllrr",
        (
            [
                r["net"],
                r["gradient_sync"],
                f"{r['collective_operands']} ("
                + ", ".join(f"{count} {kind}" for kind, count in r["collectives"].items())
                + ")",
                f"{r['allreduce1_s'] * 1e6:,.0f} / {r['allreduce2_s'] * 1e6:,.0f}",
                f"{r['latency1_s'] * 1e6:,.0f} / {r['latency2_s'] * 1e6:,.0f}",
            ]
            for r in a["nets"]
        ),
    )
    print(
        "\nmodel ÷: side 1's update time over a modelled side 2's. Gradient only: side 1's update "
        "+ gradient steps x (the gradient's all-reduce across processes − within one). "
        "Collectives: side 1's update + every collective of the compiled update x (a 1-float "
        "all-reduce across processes − within one) + gradient steps x the same difference for "
        "the gradient's bytes (its all-reduce less the 1-float one)."
    )
    side1, side2 = a["others_cores"]
    print(
        f"\nOther processes of the machine kept {side1:.2f} cores busy during side 1's job and "
        f"{side2:.2f} during side 2's (of {len(os.sched_getaffinity(0))})."
    )


def print_part_b(b: dict[str, Any], args: argparse.Namespace) -> None:
    u = UnitCosts(**b["units"])
    c = b["calibration"]
    e = args.envs_per_rank
    print(
        f"\n## B. Scaling model vs measurement\n\nPPO cartpole_ppo on slow_cartpole "
        f"({args.step_ms:g} ms sleep per step), {e} envs per env rank (global_num_envs = {e} x N), "
        f"T = {rollout_length()}, {args.updates} updates per job, 1 learner (1 CPU device), "
        f"{u.cores} cores.\n"
    )
    cost_rows = ", ".join(
        f"{r['rows']:,} ({r['update_s'] * 1e3:.1f} ms)" for r in b["update_costs"]
    )
    pause_ms = b["update_costs"][0]["pause_s"] * 1e3
    polls = b["polls"]
    units = [
        ("env step (sleep + CartPole)", f"{u.step_s * 1e3:.3f} ms", f"in process, 150 x {e} steps"),
        (
            "env step, 0 ms sleep (for reference)",
            f"{b['env_step_s'][0.0] * 1e6:.1f} µs",
            f"in process, 2000 x {e} steps",
        ),
        (
            f"CPU of a vector step ({e} envs, no sleep)",
            f"{u.vec_cpu_s * 1e6:.0f} µs",
            "calibration job: actor_env_step_s / T",
        ),
        (
            "policy call per vector step",
            f"{u.policy_s * 1e6:.0f} µs",
            "calibration job: actor_inference_s / T",
        ),
        (
            "messages + bookkeeping per round",
            f"{u.msg_s * 1e3:.2f} ms",
            "calibration job: round − env step − policy − update",
        ),
        (
            "update, fixed per update",
            f"{u.update_fixed_s * 1e3:.2f} ms",
            f"1 process, 1 device, 64x64, each update after a {pause_ms:.0f} ms pause: fit "
            f"over {cost_rows} rows",
        ),
        ("update, per sample", f"{u.update_row_s * 1e6:.2f} µs", "same fit"),
        (
            "the update's slowdown with N env ranks polling",
            ", ".join(
                f"N={n}: {x:.2f}x" for n, x in zip(u.pollers[1:], u.slowdown[1:], strict=True)
            ),
            f"mpiexec -n {1 + max(u.pollers)}: update at {polls[-1]['rows']:,} rows while N ranks "
            "run the env rank's wait loop on the MPI channel ÷ alone (median of pairs)",
        ),
        (
            "cores a polling env rank keeps busy",
            f"{polls[-1]['poll_cpu_share']:.3f}",
            f"same, median over the {max(u.pollers)} polling ranks",
        ),
        (
            "all-reduce of the gradient / of 1 float, 2 processes",
            f"{u.allreduce_s * 1e6:,.0f} / {u.latency_s * 1e6:,.0f} µs",
            f"part A, 64x64; {u.collectives} collectives per update (2 learners only)",
        ),
        ("cores", f"{u.cores}", "os.sched_getaffinity"),
    ]
    print_table(["unit cost", "value", "measured by"], "lrl", (list(unit) for unit in units))
    calibration_fit = u.update_fixed_s + u.update_row_s * c["rows"]
    print(
        f"\nCalibration job (1 env rank, 0 ms env step): round {c['round_s'] * 1e3:.1f} ms, "
        f"update {c['time/learner_update_s'] * 1e3:.1f} ms (the fit: {calibration_fit * 1e3:.1f} "
        f"ms), {c['steps_per_s']:,.0f} steps/s; others' load {c['others_cores']:.2f} cores.\n"
    )
    print_table(
        [
            "learners", "env ranks", "envs", "rows/round", "predicted steps/s",
            "measured steps/s", "measured ÷ predicted", "predicted bottleneck",
            "others' load (cores)",
        ],
        "rrrrrrrlr",
        (
            [
                f"{run['learners']}", f"{run['env_ranks']}", f"{run['envs']}", f"{run['rows']:,}",
                f"{run['predicted']['steps_per_s']:,.0f}", f"{run['steps_per_s']:,.0f}",
                f"{run['steps_per_s'] / run['predicted']['steps_per_s']:.2f}",
                run["predicted"]["bottleneck"], f"{run['others_cores']:.2f}",
            ]
            for run in b["runs"]
        ),
    )  # fmt: skip
    print(
        "\nPer round (ms), predicted / measured: the env phase vs the learner's wait for the "
        "segments, the update, and the rest of the round (messages, bookkeeping: measured, "
        "round − wait − update); measured: medians over the steady rounds (updates >= 3) of "
        "each job's timings.jsonl, a round being the wall-clock between two updates.\n"
    )
    print_table(
        [
            "env ranks", "round", "env phase / learner wait", "update", "rest", "update slowdown",
            "env ranks' env step", "policy calls", "env rank CPU share",
        ],
        "rrrrrrrrr",
        (_round_row(run, u) for run in b["runs"]),
    )  # fmt: skip
    shifts = bottleneck_shifts(e, rollout_length(), u)
    print(
        "\nBottleneck by the model, as env ranks are added (one learner, "
        f"{e} envs each): " + "; ".join(f"from N = {n}: {what}" for n, what in shifts) + "."
    )


PROJECTED_LEARNERS = (1, 2, 4, 8)
PROJECTED_ENV_RANKS = (10, 100, 1000)
PROJECTED_MODELS = {"64x64 MLP": 9_155, "135 M": 135_000_000, "1 B": 1_000_000_000}


def print_part_c(b: dict[str, Any], args: argparse.Namespace) -> None:
    """The projection to a cluster (`project`) from part B's unit costs."""
    u = UnitCosts(**b["units"])
    cluster = Cluster(link_gbps=args.link_gbps)
    e, t = args.envs_per_rank, rollout_length()
    print(
        f"\n## C. Projection to a cluster\n\nThe part B job's PPO ({e} envs per env rank, "
        f"T = {t}, the 64x64 update) on L learner hosts and N env ranks of a core each, hosts "
        f"joined by {cluster.link_gbps:g} Gb/s links; the sync columns are the learner's seconds "
        "per update to send a policy of that size to its N / L env ranks, by broadcast (the "
        "round's) and by one send per rank.\n"
    )
    models = list(PROJECTED_MODELS)
    rows = []
    for learners in PROJECTED_LEARNERS:
        for n in PROJECTED_ENV_RANKS:
            p = project(learners, n, e, t, u, cluster, PROJECTED_MODELS[models[0]])
            syncs = [
                project(learners, n, e, t, u, cluster, PROJECTED_MODELS[m]) for m in models[1:]
            ]
            rows.append(
                [
                    f"{learners}",
                    f"{n}",
                    f"{p['steps_per_s']:,.0f}",
                    p["bottleneck"],
                    f"{p['env_phase_s'] * 1e3:.0f}",
                    f"{p['update_s'] * 1e3:.0f}",
                    f"{p['reduce_s'] * 1e3:.0f}",
                    *(f"{s['sync_s']:.2f} / {s['sends_s']:.2f}" for s in syncs),
                    syncs[-1]["bottleneck"],
                ]
            )
    print_table(
        [
            "learners", "env ranks", "steps/s (64x64)", "bottleneck (64x64)", "env phase ms",
            "update ms", "all-reduce ms", *(f"{m} sync s (broadcast / sends)" for m in models[1:]),
            "bottleneck (1 B sync)",
        ],
        "rrrlrrrrrl",
        rows,
    )  # fmt: skip


def _round_row(run: dict[str, Any], u: UnitCosts) -> list[str]:
    """A part B job's row of the per-round table: predicted / measured milliseconds."""
    p = run["predicted"]
    return [
        f"{run['env_ranks']}",
        f"{p['round_s'] * 1e3:.0f} / {run['round_s'] * 1e3:.0f}",
        f"{p['env_phase_s'] * 1e3:.0f} / {run['time/learner_wait_s'] * 1e3:.0f}",
        f"{p['update_s'] * 1e3:.1f} / {run['time/learner_update_s'] * 1e3:.1f}",
        f"{u.msg_s * 1e3:.1f} / {run['learner_rest_s'] * 1e3:.1f}",
        f"{p['slowdown']:.2f}x",
        f"{run['time/actor_env_step_s'] * 1e3:.0f}",
        f"{run['time/actor_inference_s'] * 1e3:.1f}",
        f"{run['env_rank_cpu_share']:.3f}",
    ]
