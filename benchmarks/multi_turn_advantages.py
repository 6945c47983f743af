"""GRPO across turns against token-level PPO with a critic on a multi-turn env, at equal
updates, in one run.

Both sides train the same experiment (default `experiments/openenv_sums_smollm2.yaml`: SmolLM2
+ LoRA, a sum to answer with a second attempt after a wrong one) in one process, `agentenv
train` as a user runs it, with the same seed, envs, messages per update, optimizer and KL
term. They differ in the advantage alone:

- `group`: the file's GRPO, every message of an episode trained on its episode's return
  standardized over the other episodes of its group (the same question);
- `gae`: token-level PPO, a value head on the policy's trunk, GAE over the tokens of the
  whole episode (`--gae-lambda`, gamma 1), advantages normalized per minibatch: the critic
  learns which turns pay instead of comparing episodes.

Printed per side: each update's mean episode return (its own episodes: the file's
`run.return_window`), the means of the first and last five updates, the last update's
accuracy, and seconds per update (the median after the first; the critic's side computes a
value head too). One seed is one curve: a single update's mean moves by about +-0.1 with
sampling alone on 32 episodes.

    python benchmarks/multi_turn_advantages.py                        # 20 updates, ~40 min
    python benchmarks/multi_turn_advantages.py --set run.total_env_steps=256   # 4 updates
    python benchmarks/multi_turn_advantages.py --set env.id=agentenv_jax/ToolArithmetic-v0 \
        --set 'env.kwargs={max_operand: 9, max_turns: 2, response_length: 48}'   # the tool task
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

import common

OFFLINE = {"HF_HUB_OFFLINE": "1"}
SIDES = ("group", "gae")


def side_settings(side: str, gae_lambda: float) -> list[str]:
    """The `--set` strings that make the experiment's side `side`."""
    if side == "group":
        return []  # the file as it is
    return [
        "algorithm.advantage=gae",
        f"algorithm.gae_lambda={gae_lambda}",
        "algorithm.normalize_advantages=true",
    ]


def summarise(run_dir: Path, train_s: float) -> dict[str, Any]:
    """A side's curve and timings from its run folder."""
    metrics = common.read_jsonl(run_dir / "metrics.jsonl")
    returns = [m["episode_return_mean"] for m in metrics]
    return {
        "updates": len(metrics),
        "train_s": train_s,
        "returns": returns,
        "accuracy": [m.get("accuracy") for m in metrics],
        "explained_variance": [m.get("explained_variance") for m in metrics],
        "first5": statistics.fmean(returns[:5]),
        "last5": statistics.fmean(returns[-5:]),
        "s_per_update": common.median(
            common.update_seconds(common.read_jsonl(run_dir / "timings.jsonl"))
        ),
    }


def main() -> None:
    parser = common.make_parser(
        __doc__,
        config=common.EXPERIMENTS / "openenv_sums_smollm2.yaml",
        seeds=[0],
        run_timeout=3600,
        keep_runs=True,
        overrides=True,
    )
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--gae-lambda", type=float, default=0.95, help="the critic side's")
    args = parser.parse_args()
    os.environ.update(OFFLINE)
    print(
        f"{args.config.name}: advantages across turns, sides {args.sides}, seeds {args.seeds}, "
        f"overrides {args.set or 'none'}"
    )
    print(common.provenance(), flush=True)
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in args.sides}
    with common.runs_folder(args.keep_runs, "agentenv_multi_turn_advantages_") as root:
        for seed in args.seeds:
            for side in args.sides:
                name = f"{side}_seed{seed}"
                settings = [
                    *args.set,
                    *side_settings(side, args.gae_lambda),
                    *common.run_settings(root, name, seed=seed),
                ]
                command = common.train_command(args.config, settings)
                _, train_s = common.run_job(command, name, args.timeout, OFFLINE)
                results[side].append({"seed": seed, **summarise(root / name, train_s)})
                run = results[side][-1]
                print(f"  {name}: {run['updates']} updates in {train_s:.0f} s", flush=True)
    print()
    common.print_header(
        f"{'side':>5} | {'seed':>4} | {'updates':>7} | {'s/update':>8} | {'first 5':>7} | "
        f"{'last 5':>7} | {'last accuracy':>13} | per-update mean return"
    )
    for side, runs in results.items():
        for run in runs:
            curve = " ".join(f"{r:.2f}" for r in run["returns"])
            accuracy = run["accuracy"][-1]
            print(
                f"{side:>5} | {run['seed']:>4} | {run['updates']:>7} | "
                f"{run['s_per_update']:8.1f} | {run['first5']:7.3f} | {run['last5']:7.3f} | "
                f"{accuracy if accuracy is None else f'{accuracy:.3f}':>13} | {curve}"
            )
    for run in results.get("gae", []):
        variances = " ".join("-" if v is None else f"{v:.2f}" for v in run["explained_variance"])
        print(f"critic's explained variance per update, seed {run['seed']}: {variances}")
    common.save_report(args, results=results)


if __name__ == "__main__":
    main()
