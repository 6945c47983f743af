"""Synchronous against asynchronous generation for token-level PPO under central inference, in
one run: seconds per update, tokens generated per second, env ranks' idle time and accuracy at
equal updates.

Both sides run `mpiexec -n 3 agentenv train CONFIG` (1 learner, 2 env ranks) with
`topology.inference: learner`, the learner generating every answer:

* synchronous: `algorithm.max_policy_lag: 0`, `topology.inference_serving: between_rounds`:
  env ranks generate a round's answers while the learner waits, then wait while it updates;
* asynchronous: `max_policy_lag: 2` on the serving thread: env ranks generate the next
  rounds' answers while the learner updates (up to 2 updates stale; the update corrects for it
  with truncated importance weights, `algorithm.importance_weight_cap`);
* lag2_between_rounds (with `--sides`): `max_policy_lag: 2` served between rounds only, the
  asynchronous side's serving alone changed: env ranks may run ahead, but their requests wait
  while the learner updates.

Per run, from its own files: "s/update" is the median of updates 3..N's durations
(`timings.jsonl`'s `wall_s`, the first two holding the compiles); "tokens/s" the tokens
generated over updates 3..N (`metrics.jsonl`'s cumulative `tokens_generated`) over their
seconds; "queued s" the median per update of the env ranks' `time/actor_inference_queue_s`
(their requests' waiting beyond being answered), "idle s" that plus
`time/actor_transport_wait_s`; "answered while updating" the requests the learner answered
while its update ran (`summary.json`'s `central_inference.requests_while_updating`) over all
it answered; "accuracy" the mean of the last 10 updates' `accuracy`. Sides alternate which goes
first from seed to seed, each in a fresh job with a cold compilation cache. The ratio is
asynchronous / synchronous seconds per update (below 1: faster), printed when both ran.

    python benchmarks/async_generation.py                      # arithmetic_ppo as shipped
    python benchmarks/async_generation.py --set env.kwargs.response_length=16 \\
        --set algorithm.num_epochs=1 --set algorithm.num_minibatches=1   # generation-heavy
    python benchmarks/async_generation.py --config experiments/arithmetic_smollm2.yaml \\
        --set run.total_env_steps=640 --seeds 0                  # SmolLM2, 20 updates
    python benchmarks/async_generation.py --sides asynchronous lag2_between_rounds --seeds 1 \\
        --set env.kwargs.response_length=16 --set algorithm.num_epochs=1 \\
        --set algorithm.num_minibatches=1 --set run.total_env_steps=5120   # serving alone
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import common
import numpy as np

SIDES: dict[str, list[str]] = {
    "synchronous": ["algorithm.max_policy_lag=0", "topology.inference_serving=between_rounds"],
    "asynchronous": ["algorithm.max_policy_lag=2", "topology.inference_serving=thread"],
    "lag2_between_rounds": [
        "algorithm.max_policy_lag=2",
        "topology.inference_serving=between_rounds",
    ],
}
DEFAULT_SIDES = ["synchronous", "asynchronous"]
SKIPPED_UPDATES = 2  # the first updates hold the compiles
ACCURACY_UPDATES = 10


def measure(run_dir: Path) -> dict[str, float]:
    """One run's numbers (module docstring), from its metrics and timings."""
    timings = common.read_jsonl(run_dir / "timings.jsonl")
    metrics = common.read_jsonl(run_dir / "metrics.jsonl")
    ends = [record["wall_s"] for record in timings]
    timed = ends[SKIPPED_UPDATES - 1 :]
    tokens = metrics[-1]["tokens_generated"] - metrics[SKIPPED_UPDATES - 1]["tokens_generated"]
    queued = [record["time/actor_inference_queue_s"] for record in timings[SKIPPED_UPDATES:]]
    idle = [
        record["time/actor_inference_queue_s"] + record["time/actor_transport_wait_s"]
        for record in timings[SKIPPED_UPDATES:]
    ]
    served = json.loads((run_dir / "summary.json").read_text())["central_inference"]
    return {
        "updates": len(timings),
        "s_per_update": common.median(common.update_seconds(timings)[SKIPPED_UPDATES - 1 :]),
        "tokens_per_s": tokens / (timed[-1] - timed[0]),
        "queued_s": common.median(queued),
        "idle_s": common.median(idle),
        "answered_while_updating": served["requests_while_updating"] / served["requests"],
        "accuracy": float(np.mean([r["accuracy"] for r in metrics[-ACCURACY_UPDATES:]])),
        "policy_lag_max": max(record["policy_lag_max"] for record in metrics),
    }


def main() -> None:
    parser = common.make_parser(
        __doc__,
        config=common.EXPERIMENTS / "arithmetic_ppo.yaml",
        seeds=[0, 1],
        run_timeout=1800.0,
        keep_runs=True,
        overrides=True,
    )
    parser.add_argument(
        "--sides", nargs="+", choices=list(SIDES), default=DEFAULT_SIDES, help="sides to run"
    )
    args = parser.parse_args()
    common.require_mpiexec()
    print(
        f"{args.config.name}: {', '.join(args.sides)} (central inference, mpiexec -n 3), "
        f"seeds {args.seeds}, overrides {args.set or 'none'}"
    )
    print(common.provenance(), flush=True)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in args.sides}
    with common.runs_folder(args.keep_runs, "agentenv_async_generation_") as root:
        for index, seed in enumerate(args.seeds):
            order = list(args.sides) if index % 2 == 0 else list(args.sides)[::-1]
            for side in order:
                name = f"{side}-seed{seed}"
                settings = [
                    *args.set,
                    "topology.inference=learner",
                    *SIDES[side],
                    *common.run_settings(root, name, seed=seed),
                ]
                started = time.perf_counter()
                common.run_agentenv_mpi(3, args.config, settings, name, args.timeout)
                runs[side].append({"seed": seed, **measure(root / name)})
                print(f"  {name} done in {time.perf_counter() - started:.0f} s", flush=True)
    header = (
        f"{'side':<19} | {'seed':>4} | {'updates':>7} | {'s/update':>8} | {'tokens/s':>9} | "
        f"{'queued s':>8} | {'idle s':>6} | {'answered while updating':>23} | "
        f"{'accuracy':>8} | {'max lag':>7}"
    )
    print()
    common.print_header(header)
    for side, side_runs in runs.items():
        for run in side_runs:
            print(
                f"{side:<19} | {run['seed']:>4} | {run['updates']:>7} | "
                f"{run['s_per_update']:8.3f} | {run['tokens_per_s']:9.0f} | "
                f"{run['queued_s']:8.3f} | {run['idle_s']:6.3f} | "
                f"{run['answered_while_updating']:23.2f} | {run['accuracy']:8.3f} | "
                f"{run['policy_lag_max']:>7}"
            )
    ratios = []
    if {"asynchronous", "synchronous"} <= set(runs):
        ratios = [
            a["s_per_update"] / s["s_per_update"]
            for a, s in zip(runs["asynchronous"], runs["synchronous"], strict=True)
        ]
        print(
            "asynchronous / synchronous seconds per update, by seed: "
            + ", ".join(f"{ratio:.3f}" for ratio in ratios)
        )
    common.save_json(
        args.json,
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "provenance": common.provenance(),
            "runs": runs,
            "ratios": ratios,
        },
    )


if __name__ == "__main__":
    main()
