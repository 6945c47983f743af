"""Generation through the agent endpoint against the same generation called directly, in one
run: 64 agent programs (`example_agents.calculator_agent`, the plain `openai` client) on one
env (one env rank's worth), SmolLM2-135M-Instruct under `experiments/agent_calculator_smollm2.yaml`.

Endpoint side: `--steps` vector steps of the env, each one batched generation for the 64
pending calls (`TextPolicy.act`) and `env.step`, which hands the completions back over HTTP
and waits for the agents' next calls (their tool runs, the chat template, tokenization).
Direct side: `TextPolicy.act` on the same observations with the same keys (a fresh policy of
the same seed), so the same tokens. Both are clocked from their first call, after a warm-up
call of each (compilation). The ratio is the endpoint's generated tokens/s ÷ the direct
side's (goal >= 0.8); the endpoint's added latency per call is (endpoint s − direct s) per
step, the time a call waits beyond its generation.

    python benchmarks/agent_endpoint.py
    python benchmarks/agent_endpoint.py --steps 2 --envs 16     # a quick look
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import EXPERIMENTS, make_parser, print_header, provenance, save_json  # noqa: E402

GOAL = 0.8


def main() -> None:
    parser = make_parser(__doc__, config=EXPERIMENTS / "agent_calculator_smollm2.yaml")
    parser.add_argument("--steps", type=int, default=4, help="vector steps timed per side")
    parser.add_argument("--envs", type=int, default=64, help="concurrent agents")
    args = parser.parse_args()
    import jax

    from agentenv_jax.actor.text_policy import TextPolicy
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.envs.text import make_text_vector_env
    from agentenv_jax.learner.inference_server import generated_tokens
    from agentenv_jax.networks.flat_params import FlatLayout
    from agentenv_jax.networks.text_models import (
        initial_language_model_params,
        language_model_for,
        text_tokenizer,
    )

    print(provenance("openai"), flush=True)
    config = load_config(args.config)
    model = config.network.language_model
    kwargs = {**config.env.kwargs, "group_size": 1, "agent_timeout_s": 600}
    env = make_text_vector_env(config.env.id, args.envs, kwargs, text_tokenizer(model))
    lm = language_model_for(model, env.text_spec)
    layout = FlatLayout(lm.param_shapes())
    flat = np.asarray(layout.ravel(initial_language_model_params(lm, model, jax.random.key(0))))

    def policy() -> TextPolicy:
        made = TextPolicy(lm, layout.unravel, env.text_spec, 0, 0, args.envs)
        made.set_params(flat)
        return made

    try:
        through_endpoint = policy()
        obs, _ = env.reset(seed=0)
        through_endpoint.act(obs)  # compiles; its noise is the direct side's warm-up's too
        seen, tokens = [], 0
        started = time.perf_counter()
        for _ in range(args.steps):
            seen.append(obs)
            actions, _, _ = through_endpoint.act(obs)
            obs, _, _, _, info = env.step(actions)
            tokens += int(info["response_tokens"].sum())
        endpoint_s = time.perf_counter() - started
        accounting = env.accounting
    finally:
        env.close()

    direct = policy()
    direct.act(seen[0])  # the same warm-up call, so the keys line up
    direct_tokens = 0
    started = time.perf_counter()
    for batch in seen:
        actions, _, _ = direct.act(batch)
        direct_tokens += generated_tokens(actions, env.text_spec.eos_id)
    direct_s = time.perf_counter() - started

    ratio = (tokens / endpoint_s) / (direct_tokens / direct_s)
    added_ms = 1000 * (endpoint_s - direct_s) / args.steps
    print(
        f"{args.envs} agents, {args.steps} steps: {accounting.calls} calls answered, "
        f"{accounting.generation_batches} generation calls (largest batch "
        f"{accounting.largest_batch}), {sum(accounting.ended.values())} runs ended"
    )
    print_header(f"{'side':<10} | {'tokens':>7} | {'seconds':>8} | {'tokens/s':>8}")
    print(f"{'endpoint':<10} | {tokens:>7} | {endpoint_s:8.2f} | {tokens / endpoint_s:8.1f}")
    print(
        f"{'direct':<10} | {direct_tokens:>7} | {direct_s:8.2f} | {direct_tokens / direct_s:8.1f}"
    )
    print(
        f"ratio endpoint / direct: {ratio:.3f} (goal >= {GOAL}: "
        f"{'ok' if ratio >= GOAL else 'MISS'}); added latency per call: {added_ms:.0f} ms per "
        f"step of {args.envs} calls"
    )
    save_json(
        args.json,
        {
            "provenance": provenance("openai"),
            "envs": args.envs,
            "steps": args.steps,
            "endpoint": {"tokens": tokens, "seconds": endpoint_s},
            "direct": {"tokens": direct_tokens, "seconds": direct_s},
            "ratio": ratio,
            "added_ms_per_step": added_ms,
        },
    )


if __name__ == "__main__":
    main()
