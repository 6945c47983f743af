"""GRPO with LoRA on SmolLM2-135M-Instruct: held-out accuracy before and after training, per
seed, in one run.

Each seed trains `experiments/chain_sum_smollm2.yaml` (reasoning-gym chain_sum, sums and
differences of three one-digit numbers, the training side of a split by question text) in one
process, `agentenv train` as a user runs it, with that seed. Accuracy is measured on the
held-out questions, which training never draws, the same `--episodes` problems for every side
(evaluation seeds 0..N-1, as `agentenv eval --split test` draws them), decoded (nearly)
greedily, after the script prints how many distinct questions each side holds. "zero-shot" is
the untrained model (the base under zero adapters), "trained" the run's final checkpoint
(`agentenv_jax.evaluate(run, split="test")`). The gain is trained − zero-shot accuracy in
points (goal: at least 15 on every seed, each run at most 30 minutes on this machine).
"train s" is the training run's wall time, launch to exit. `--plot PNG` draws every seed's
training accuracy per update (`agentenv plot --metric accuracy`).

    python benchmarks/grpo_learning.py                       # seeds 0 and 1, ~50 min here
    python benchmarks/grpo_learning.py --seeds 0 --set run.total_env_steps=320   # smoke run
    python benchmarks/grpo_learning.py --plot learning.png --json out.json
    python tools/gsm_symbolic_jsonl.py --out /tmp/gsm    # the dataset example, its two files
    python benchmarks/grpo_learning.py --config experiments/gsm_symbolic_smollm2.yaml \
        --set env.kwargs.path=/tmp/gsm/train.jsonl --set env.kwargs.test_path=/tmp/gsm/test.jsonl
    python benchmarks/grpo_learning.py --config experiments/code_smollm2.yaml --episodes 144
    python benchmarks/grpo_learning.py --config experiments/agent_calculator_smollm2.yaml \
        --seeds 0 --episodes 128

For the agent example (`env.id: agent`, an agent program on the `openai` client) the questions
are `example_agents.arithmetic_rows`'s. For the code task (`Code-v0`) accuracy is the share of
answers that pass all their hidden tests, and the mean return the share of hidden tests passed.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import common

GOAL_POINTS = 15.0
BUDGET_S = 30 * 60  # per training run
OFFLINE = {"HF_HUB_OFFLINE": "1"}


def zero_shot_scores(run_dir: Path, episodes: int) -> tuple[float, float]:
    """The untrained model's greedy accuracy and mean return on the test split's first
    `episodes` problems, with the run's own config."""
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.networks.generation import GREEDY_TEMPERATURE
    from agentenv_jax.workflow.text_dialogues import sample_dialogues

    config = load_config(run_dir / "config.yaml")
    kwargs = {**config.env.kwargs, "split": "test"}
    config = dataclasses.replace(config, env=dataclasses.replace(config.env, kwargs=kwargs))
    sample = sample_dialogues(
        config, None, num_episodes=episodes, seed=0, temperature=GREEDY_TEMPERATURE
    )
    return float(sample.accuracy), float(sum(sample.returns) / len(sample.returns))


def split_sizes(config_path: Path, overrides: list[str], entries: int = 200_000) -> dict[str, int]:
    """Distinct questions on each side of the experiment's split: a reasoning-gym task's among
    its first `entries` dataset entries (all of chain_sum's 4,000 three-term questions), a
    dataset file's (`agentenv_jax/Dataset-v0`) among all its rows, the code task's
    (`agentenv_jax/Code-v0`) among all its problems."""
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.envs.text.code_tasks import split_sizes as code_split_sizes
    from agentenv_jax.envs.text.dataset_tasks import DatasetRows
    from agentenv_jax.envs.text.reasoning_gym_tasks import ReasoningGymTask
    from agentenv_jax.envs.text.registry import ENV_KWARGS

    config = load_config(config_path, overrides)
    kwargs = {k: v for k, v in config.env.kwargs.items() if k not in ENV_KWARGS}
    if config.env.id == "agentenv_jax/Dataset-v0":
        # The task's own reading of its rows: its files, split and prompt column.
        fields = ("path", "test_path", "test_fraction", "prompt_column", "system_prompt")
        rows = {k: kwargs[k] for k in fields if k in kwargs}
        train = DatasetRows(**rows).distinct_prompts()
        if rows.get("test_path") is None:  # both sides in one file, split by prompt
            return train
        return {
            "train": train["train"],
            "test": DatasetRows(**rows, split="test").distinct_prompts()["test"],
        }
    if config.env.id == "agentenv_jax/Code-v0":
        return code_split_sizes(kwargs.get("test_fraction", 0.2))
    if config.env.id == "agent":  # the shipped example's generator counts its questions
        from agentenv_jax.envs.import_path import import_object

        module = kwargs["rows"].rpartition(":")[0]
        return import_object(f"{module}:split_sizes", "env.kwargs.rows")()
    dataset = config.env.id.split("/", 1)[1]
    return ReasoningGymTask(dataset, **kwargs).distinct_questions(entries)


def trained_scores(run_dir: Path, episodes: int) -> tuple[float, float]:
    """The final checkpoint's greedy accuracy and mean return on the same problems."""
    from agentenv_jax import evaluate

    sample = evaluate(run_dir, episodes=episodes, split="test").dialogues
    return float(sample.accuracy), float(sum(sample.returns) / len(sample.returns))


def main() -> None:
    parser = common.make_parser(
        __doc__,
        config=common.EXPERIMENTS / "chain_sum_smollm2.yaml",
        seeds=[0, 1],
        run_timeout=2 * BUDGET_S,
        keep_runs=True,
        overrides=True,
    )
    parser.add_argument("--episodes", type=int, default=256, help="held-out problems")
    parser.add_argument("--plot", type=Path, help="write the training accuracy curves here")
    args = parser.parse_args()
    os.environ.update(OFFLINE)
    print(
        f"{args.config.name}: GRPO held-out accuracy, seeds {args.seeds}, "
        f"{args.episodes} test problems, overrides {args.set or 'none'}"
    )
    print(common.provenance(), flush=True)
    sizes = split_sizes(args.config, args.set)
    print(
        f"distinct questions: {sizes['train']} on the training side, {sizes['test']} held out "
        "(split by a hash of the question text: none on both sides)",
        flush=True,
    )
    runs: list[dict[str, Any]] = []
    with common.runs_folder(args.keep_runs, "agentenv_grpo_learning_") as root:
        zero_shot = None
        for seed in args.seeds:
            run_dir, train_s = common.train_seed(args, root, seed, OFFLINE)
            if zero_shot is None:  # the same untrained model and problems for every seed
                zero_shot, zero_shot_return = zero_shot_scores(run_dir, args.episodes)
            trained, trained_return = trained_scores(run_dir, args.episodes)
            updates = len(common.read_jsonl(run_dir / "metrics.jsonl"))
            runs.append(
                {
                    "seed": seed,
                    "updates": updates,
                    "train_s": train_s,
                    "zero_shot": zero_shot,
                    "trained": trained,
                    "gain_points": 100 * (trained - zero_shot),
                    "zero_shot_return": zero_shot_return,
                    "trained_return": trained_return,
                }
            )
            print(f"  {run_dir.name}: {updates} updates in {train_s:.0f} s", flush=True)
        if args.plot is not None:
            command = [sys.executable, "-m", "agentenv_jax.workflow.cli", "plot"]
            command += [str(root / f"seed{seed}") for seed in args.seeds]
            command += ["--metric", "accuracy", "-o", str(args.plot)]
            subprocess.run(command, check=True)
            print(f"wrote {args.plot}")
    print()
    common.print_header(
        f"{'seed':>4} | {'updates':>7} | {'train s':>7} | {'zero-shot':>9} | {'trained':>7} | "
        f"{'gain (points)':>13} | {'return: zero-shot':>17} | {'trained':>7}"
    )
    for run in runs:
        within = run["gain_points"] >= GOAL_POINTS and run["train_s"] <= BUDGET_S
        print(
            f"{run['seed']:>4} | {run['updates']:>7} | {run['train_s']:7.0f} | "
            f"{run['zero_shot']:9.3f} | {run['trained']:7.3f} | {run['gain_points']:9.1f} "
            f"{'ok' if within else 'MISS':<4} | {run['zero_shot_return']:17.3f} | "
            f"{run['trained_return']:7.3f}"
        )
    print(
        f"goal: held-out accuracy +{GOAL_POINTS:.0f} points on every seed, "
        f"each run <= {BUDGET_S // 60} min"
    )
    common.save_report(args, distinct_questions=sizes, runs=runs)


if __name__ == "__main__":
    main()
