"""Long-tailed answers: seconds per update of GRPO on SmolLM2 asked to reason before it answers,
with today's static generation and padded updates against continuous batching
(`network.language_model.generation_slots`) and sequence packing (`algorithm.packed_row_length`),
in one run.

Every side trains `experiments/gsm_symbolic_smollm2.yaml` (SmolLM2-135M-Instruct with LoRA,
GRPO, 16 envs: 4 questions x 4 answers, 2 steps an update, "Solve the problem step by step,
then end with: The answer is <number>.") with answers of up to `--response-length` tokens
(256: most end well before, a few run to the limit), on the same data files (written by
`tools/gsm_symbolic_jsonl.py` into the runs folder) and seed, in a fresh process one after the
other, `agentenv train` as a user runs it. The sides:

- `static`: one batch of the 16 answers, decoded until the longest ends; padded minibatches.
- `packed`: `algorithm.packed_row_length` = context + response length.
- `slots`: `generation_slots` = `--slots` (8): the 16 answers through 8 rows of KV cache.
- `slots_packed`: both.
- `async`: `mpiexec -n 2` (a learner and an env rank) with `algorithm.max_policy_lag` = 1, the
  env rank generating the next round while the learner updates; packed updates.
- `async_partial`: the same with partial rollouts (`algorithm.partial_rollout_steps` =
  `--partial-steps`, 32): answers in flight when new parameters arrive continue under them.
  (Partial rollouts take the env rank's own batch: no slots.)

Each side's per-update seconds are the differences of `timings.jsonl`'s `wall_s` (seconds since
the run's session started, at the end of each update); the first update, which holds the XLA
compiles, is left out, and "s/update" is the median of the rest. Its split (`time/...`:
generating on the env rank, updating on the learner) and its padding measures
(`generation_utilisation`, `update_padding_fraction`, `packed_padding_fraction`) are the
medians of the same updates. Every side samples the same answers at the same seed (each env's
key is its own), up to float rounding. The ratio is static s/update / the side's (goal >= 2
for `slots_packed`). The async sides' answers differ from the others' after their first
update (one update behind: its tokens sampled by older parameters), so their rewards are not
comparable update by update.

    python benchmarks/long_tail.py                       # 4 updates a side, every side
    python benchmarks/long_tail.py --updates 2 --sides static slots_packed   # a quick look
    python benchmarks/long_tail.py --sides static async async_partial  # partial rollouts
    python benchmarks/long_tail.py --slots 32 --set env.global_num_envs=64   # an accelerator
    python benchmarks/long_tail.py --report RUNS --sides static packed   # kept runs' table
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import common
import numpy as np

from agentenv_jax.config import load_config

SIDES = {
    "static": lambda args: [],
    "packed": lambda args: [f"algorithm.packed_row_length={args.row_length}"],
    "slots": lambda args: [f"network.language_model.generation_slots={args.slots}"],
    "slots_packed": lambda args: [
        f"network.language_model.generation_slots={args.slots}",
        f"algorithm.packed_row_length={args.row_length}",
    ],
    "async": lambda args: [
        "algorithm.max_policy_lag=1",
        f"algorithm.packed_row_length={args.row_length}",
    ],
    "async_partial": lambda args: [
        "algorithm.max_policy_lag=1",
        f"algorithm.packed_row_length={args.row_length}",
        f"algorithm.partial_rollout_steps={args.partial_steps}",
    ],
}
RANKS = {"async": 2, "async_partial": 2}  # the others: one process
MEASURES = ("generation_utilisation", "update_padding_fraction", "packed_padding_fraction")
# Printed for the async sides (0 on the others, which never run ahead): the mean age of a
# trained token in updates, and the answers an update trained whose tokens span versions.
LAG_MEASURES = ("policy_lag_mean", "token_lag_mean", "answers_across_versions")
OFFLINE = {"HF_HUB_OFFLINE": "1"}
GOAL = 2.0


def per_update(run_dir: Path) -> dict[str, Any]:
    """A run's per-update seconds and, over updates 2..N, the medians of its split and of
    its padding measures."""
    timings = common.read_jsonl(run_dir / "timings.jsonl")
    metrics = common.read_jsonl(run_dir / "metrics.jsonl")
    seconds = common.update_seconds(timings)
    generated = [m["tokens_generated"] for m in metrics]  # the run's, so far
    later_timings, later_metrics = timings[1:], metrics[1:]
    out: dict[str, Any] = {
        "first_update_s": timings[0]["wall_s"],
        "update_s": seconds,
        "s_per_update": common.median(seconds),
        "generate_s": common.median([t["time/actor_inference_s"] for t in later_timings]),
        "learner_update_s": common.median([t["time/learner_update_s"] for t in later_timings]),
        "tokens_per_update": float(common.median(list(np.diff(generated)))),
        "answer_tokens_mean": common.median([m["response_length_mean"] for m in later_metrics]),
        "reward": [m["episode_return_mean"] for m in metrics],
    }
    for name in MEASURES + LAG_MEASURES:
        out[name] = common.median([m[name] for m in later_metrics if name in m])
    return out


def main() -> None:
    parser = common.make_parser(
        __doc__,
        config=common.EXPERIMENTS / "gsm_symbolic_smollm2.yaml",
        run_timeout=2 * 60 * 60,
        keep_runs=True,
        overrides=True,
    )
    parser.add_argument("--updates", type=int, default=4, help="updates a side (>= 2)")
    parser.add_argument("--response-length", type=int, default=256, help="answer tokens, at most")
    parser.add_argument("--slots", type=int, default=8, help="generation_slots of slots sides")
    parser.add_argument(
        "--partial-steps", type=int, default=32, help="partial_rollout_steps of async_partial"
    )
    parser.add_argument("--sides", nargs="+", choices=list(SIDES), default=list(SIDES))
    parser.add_argument(
        "--report", type=Path, help="print the table of the runs kept in this folder, no training"
    )
    args = parser.parse_args()
    if args.updates < 2:
        parser.error("--updates must be >= 2 (the first update holds the compiles)")
    if "static" not in args.sides:
        parser.error("--sides must include static (the ratios' base)")
    context_length = 256  # the experiment's: the system turn and the longest questions
    args.row_length = context_length + args.response_length
    print(
        f"{args.config.name}: answers of up to {args.response_length} tokens, {args.updates} "
        f"updates a side, slots {args.slots}, packed rows of {args.row_length} tokens, "
        f"overrides {args.set or 'none'}"
    )
    print(common.provenance(), flush=True)
    if args.report is not None:
        results = {side: per_update(args.report / side) for side in args.sides}
        report(args, results)
        return
    results: dict[str, dict[str, Any]] = {}
    with common.runs_folder(args.keep_runs, "agentenv_long_tail_") as root:
        data = root / "data"
        subprocess.run(
            [sys.executable, str(common.REPO / "tools" / "gsm_symbolic_jsonl.py")]
            + ["--rows", "400", "--out", str(data)],
            check=True,
            capture_output=True,
        )
        shared = [
            *args.set,
            f"env.kwargs.path={data / 'train.jsonl'}",
            f"env.kwargs.test_path={data / 'test.jsonl'}",
            f"env.kwargs.response_length={args.response_length}",
        ]
        config = load_config(args.config, shared)
        answers = config.env.global_num_envs * config.algorithm.rollout_length  # an update's
        shared += [f"run.total_env_steps={args.updates * answers}"]
        shared += [f"run.return_window={answers}"]  # each update's own answers
        for side in args.sides:
            settings = [*shared, *SIDES[side](args), *common.run_settings(root, side)]
            command = common.train_command(args.config, settings)
            if RANKS.get(side, 1) > 1:
                command = common.under_mpiexec(RANKS[side], command)
            _, wall = common.run_job(command, side, args.timeout, OFFLINE)
            results[side] = per_update(root / side) | {"wall_s": wall}
            print(f"  {side}: {wall:.0f} s", flush=True)
    report(args, results)


def report(args: Any, results: dict[str, dict[str, Any]]) -> None:
    """The table of each side against static, and the JSON file."""
    base = results["static"]["s_per_update"]
    print()
    common.print_header(
        f"{'side':>12} | {'s/update':>8} | {'generate':>8} | {'update':>8} | {'tokens':>6} | "
        f"{'answer':>6} | "
        f"{'gen util':>8} | {'padding':>7} | {'packed':>6} | {'ratio':>5}"
    )
    for side, r in results.items():
        ratio = base / r["s_per_update"]
        verdict = "" if side != "slots_packed" else (" ok" if ratio >= GOAL else " MISS")
        print(
            f"{side:>12} | {r['s_per_update']:8.1f} | {r['generate_s']:8.1f} | "
            f"{r['learner_update_s']:8.1f} | {r['tokens_per_update']:6.0f} | "
            f"{r['answer_tokens_mean']:6.1f} | "
            f"{r['generation_utilisation']:8.3f} | {r['update_padding_fraction']:7.3f} | "
            f"{r['packed_padding_fraction']:6.3f} | {ratio:5.2f}{verdict}"
        )
    for side, r in results.items():
        if side in RANKS:
            print(
                f"{side}: policy lag {r['policy_lag_mean']:.2f}, token lag "
                f"{r['token_lag_mean']:.2f} updates, {r['answers_across_versions']:.0f} answers an "
                "update across parameter versions (medians over updates 2..N)"
            )
    common.save_report(args, results=results)


if __name__ == "__main__":
    main()
