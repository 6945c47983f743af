"""Token-PPO updates on packed minibatches against padded ones, in one run: SmolLM2-135M-Instruct
with LoRA as `experiments/agent_calculator_smollm2.yaml` sets it (contexts of up to 256 tokens,
answers of up to 48, 2 minibatches), on messages of long-tailed lengths: contexts of 40-256
tokens and answers of 4-48, most of them short (drawn from a seeded log-uniform law).

Both sides update the same rollout from the same state with the same minibatches (the learner's
`packed_minibatches` draws them; the padded side gets only their orders), trimmed to the columns
the messages use as the learner trims them (`length_bucket` 16). Each side runs one update to
compile, then `--updates` timed ones, alternating sides. The ratio is padded seconds per update
÷ packed; the padding fractions are those of the rows each side computes.

    python benchmarks/packed_update.py
    python benchmarks/packed_update.py --updates 1 --messages 16    # a quick look
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import EXPERIMENTS, make_parser, print_header, provenance, save_json  # noqa: E402


def long_tail_rollout(text, messages: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """`[2, messages / 2]` steps of messages whose lengths are log-uniform: many short, few
    long; token ids drawn from the ordinary vocabulary."""
    length, answer = text.context_length, text.response_length
    special = {text.pad_id, text.eos_id, text.bos_id}
    ordinary = np.array([t for t in range(1000, 20000) if t not in special])
    obs = np.full((messages, length), text.pad_id, np.int32)
    action = np.full((messages, answer), text.pad_id, np.int32)
    for i in range(messages):
        c = int(np.exp(rng.uniform(np.log(40), np.log(length))))
        a = int(np.exp(rng.uniform(np.log(4), np.log(answer))))
        obs[i, length - c] = text.bos_id
        obs[i, length - c + 1 :] = rng.choice(ordinary, c - 1)
        action[i, : a - 1] = rng.choice(ordinary, a - 1)
        action[i, a - 1] = text.eos_id
    t, b = 2, messages // 2
    lengths = (action != text.pad_id).sum(axis=1)
    return {
        "obs": obs.reshape(t, b, length),
        "action": action.reshape(t, b, answer),
        "log_prob": np.where(action != text.pad_id, -2.0, 0.0).astype(np.float32).reshape(t, b, -1),
        "value": np.zeros((t, b, answer), np.float32),
        "reward": rng.integers(0, 2, (t, b)).astype(np.float32),
        "terminated": np.ones((t, b), bool),
        "truncated": np.zeros((t, b), bool),
        "valid": np.ones((t, b), np.float32),
        "bootstrap_value": np.zeros((t, b), np.float32),
        "last_value": np.zeros((b,), np.float32),
        "last_obs": obs[:b],
        "response_tokens": lengths.astype(np.int32).reshape(t, b),
    }


def main() -> None:
    parser = make_parser(__doc__, config=EXPERIMENTS / "agent_calculator_smollm2.yaml")
    parser.add_argument("--updates", type=int, default=3, help="timed updates per side")
    parser.add_argument("--messages", type=int, default=32, help="messages per update")
    args = parser.parse_args()
    import jax

    from agentenv_jax.config.loading import load_config
    from agentenv_jax.envs.text.padding import (
        trim_text_rollout,
        trimmed_lengths,
        update_padding_fraction,
    )
    from agentenv_jax.learner.text_training import language_model_training
    from agentenv_jax.networks.packing import packed_minibatches
    from agentenv_jax.networks.text_models import text_tokenizer

    print(provenance(), flush=True)
    config = load_config(args.config)
    kwargs = config.env.kwargs
    text = text_tokenizer(config.network.language_model).text_spec(
        kwargs["context_length"], kwargs["response_length"]
    )
    shapes, init_params, update, train_state = language_model_training(
        config, text, 100, lambda x: x
    )
    update = jax.jit(update)
    params = init_params(jax.random.key(0))
    rollout = long_tail_rollout(text, args.messages, np.random.default_rng(0))
    rollout = trim_text_rollout(
        rollout, trimmed_lengths(rollout["obs"], rollout["action"], text.pad_id, 16)
    )
    algo = config.algorithm
    flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
    plan = packed_minibatches(
        flat(rollout["obs"]),
        flat(rollout["action"]),
        flat(rollout["valid"]) > 0,
        text.pad_id,
        text.eos_id,
        text.context_length + text.response_length,
        algo.num_epochs,
        algo.num_minibatches,
        np.random.default_rng(1),
    )
    sides = {
        "padded": rollout | {"minibatch_orders": plan["minibatch_orders"]},
        "packed": rollout | plan,
    }
    seconds = {name: [] for name in sides}
    for timed in range(args.updates + 1):
        for name, batch in sides.items():
            state = train_state(params, jax.random.key(1))
            started = time.perf_counter()
            state, metrics = update(state, batch)
            jax.block_until_ready(metrics)
            if timed:  # the first update of each side compiles
                seconds[name].append(time.perf_counter() - started)
    padded_fraction = update_padding_fraction(
        rollout["obs"], rollout["action"], rollout["valid"], text.pad_id, text.eos_id
    )
    packed_fraction = 1.0 - np.count_nonzero(plan["packed_segments"]) / plan["packed_segments"].size
    rows = plan["packed_tokens"].shape[2]
    print(
        f"{args.messages} messages, {algo.num_minibatches} minibatches of "
        f"{args.messages // algo.num_minibatches}; padded rows of {rollout['obs'].shape[2]} + "
        f"{rollout['action'].shape[2]} columns, packed: {rows} rows of "
        f"{plan['packed_tokens'].shape[3]} a minibatch"
    )
    print_header(f"{'side':<8} | {'s / update':>10} | {'padding computed':>16}")
    means = {name: float(np.mean(s)) for name, s in seconds.items()}
    print(f"{'padded':<8} | {means['padded']:10.2f} | {padded_fraction:16.3f}")
    print(f"{'packed':<8} | {means['packed']:10.2f} | {packed_fraction:16.3f}")
    print(f"ratio padded / packed seconds per update: {means['padded'] / means['packed']:.2f}")
    save_json(
        args.json,
        {
            "provenance": provenance(),
            "messages": args.messages,
            "seconds": seconds,
            "padding_fraction": {"padded": padded_fraction, "packed": packed_fraction},
        },
    )


if __name__ == "__main__":
    main()
