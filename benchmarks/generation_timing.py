"""Generation alone, for `text_throughput.py`: seconds per jitted `generate` call of the tiny
language model, KV-cached against uncached, at each batch size (that script's docstring says
how it is clocked)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import common


def generation_worker(args: argparse.Namespace, result_prefix: str) -> None:
    """In its own process: seconds per jitted `generate` call, cached and uncached, at each
    batch size; prints one JSON result."""
    import jax
    import numpy as np

    from agentenv_jax.envs.text.tokenizer import ByteTokenizer
    from agentenv_jax.networks.generation import generate
    from agentenv_jax.networks.language_model import language_model_spec, make_language_model

    tokenizer = ByteTokenizer()
    context_length, response_length = args.gen_context, args.gen_response
    lm = make_language_model(
        language_model_spec(
            "tiny", tokenizer.vocab_size, max_length=context_length + response_length
        )
    )
    params = jax.device_put(lm.init(jax.random.PRNGKey(0)))

    def jitted(use_cache: bool):
        def call(params, context, key):
            return generate(
                lm,
                params,
                context,
                key,
                response_length=response_length,
                pad_id=tokenizer.pad_id,
                eos_id=tokenizer.eos_id,
                use_cache=use_cache,
            )

        return jax.jit(call)

    calls = {"cached": jitted(True), "uncached": jitted(False)}
    rng = np.random.default_rng(0)
    rows = []
    for batch in args.gen_batches:
        # Byte tokens (never PAD, BOS or EOS): every row a full context.
        context = jax.device_put(rng.integers(0, 256, (batch, context_length)).astype(np.int32))
        seconds: dict[str, list[float]] = {side: [] for side in calls}
        compile_s = {}
        for side, call in calls.items():
            tick = time.perf_counter()
            jax.block_until_ready(call(params, context, jax.random.PRNGKey(1)))
            compile_s[side] = time.perf_counter() - tick
        for repeat in range(args.gen_repeats):
            order = list(calls) if repeat % 2 == 0 else list(calls)[::-1]
            for side in order:
                key = jax.random.PRNGKey(2 + repeat)
                tick = time.perf_counter()
                jax.block_until_ready(calls[side](params, context, key))
                seconds[side].append(time.perf_counter() - tick)
        call_s = {side: common.median(values) for side, values in seconds.items()}
        rows.append(
            {
                "batch": batch,
                "call_s": call_s,
                "first_call_s": compile_s,
                "tokens_per_s": {s: batch * response_length / t for s, t in call_s.items()},
            }
        )
    result = {"context": context_length, "response": response_length, "rows": rows}
    print(result_prefix + json.dumps(result), flush=True)


def print_generation(result: dict[str, Any]) -> None:
    print(
        f"\ngeneration alone: tiny model, jitted generate, context {result['context']}, "
        f"response {result['response']} (median of the calls after the first)"
    )
    header = (
        f"{'batch':>5} | {'cached ms':>9} | {'uncached ms':>11} | {'cached tok/s':>12} | "
        f"{'uncached tok/s':>14} | {'cached ÷ uncached':>17} | {'first calls s':>13}"
    )
    common.print_header(header)
    for row in result["rows"]:
        call_s, rate = row["call_s"], row["tokens_per_s"]
        print(
            f"{row['batch']:5} | {1000 * call_s['cached']:9.2f} | "
            f"{1000 * call_s['uncached']:11.2f} | {rate['cached']:12,.0f} | "
            f"{rate['uncached']:14,.0f} | {rate['cached'] / rate['uncached']:17.2f} | "
            f"{row['first_call_s']['cached']:5.1f}, {row['first_call_s']['uncached']:5.1f}"
        )
