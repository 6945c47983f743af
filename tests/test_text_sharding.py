"""The token-PPO update of the transformer trained from scratch, and of a pretrained Llama-family
model loaded from its folder, gives the same result on 1 device and on a `{data: 2, model: 4}`
mesh of 8 host devices, where each device holds about a quarter of the parameters, reference
parameters and Adam moments (FSDP), placed there as the learner places them (the host weights
straight onto their shards); and so does the update on packed minibatches
(`algorithm.packed_row_length`), its rows split over the data axis.

XLA's host-device count is fixed when the backend starts, so the comparison runs in a fresh
interpreter with `--xla_force_host_platform_device_count=8`; both meshes live in that process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from jax.sharding import PartitionSpec

from agentenv_jax.learner.loop import rollout_shardings
from agentenv_jax.parallel.mesh import make_mesh

from conftest import REPO, require_reference

pytestmark = pytest.mark.slow  # every test here starts a process

# Builds the update as the learner does (`Learner.__init__`): `language_model_training` with
# the mesh's row constraint, the state's shardings from its abstract shape, `jit_sharded_update`.
SCRIPT = r"""
import dataclasses, json, sys
import jax, jax.numpy as jnp, numpy as np, optax
from agentenv_jax.learner.loop import initial_state, jit_sharded_update
from agentenv_jax.learner.on_policy_model import OnPolicyModel
from agentenv_jax.learner.text_training import language_model_training
from agentenv_jax.networks.packing import packed_minibatches
from agentenv_jax.parallel.mesh import BATCH_AXIS, make_mesh, row_constraint
from agentenv_jax.parallel.partitioning import check_model_axis_divides, state_shardings
from test_token_ppo import TEXT, make_text_rollout, rescored, scoring_model, text_config

assert len(jax.devices()) == 8, jax.devices()
config = text_config(learning_rate=1e-4)
if sys.argv[2]:  # a pretrained model's folder
    network = dataclasses.replace(
        config.network,
        language_model=dataclasses.replace(config.network.language_model, pretrained=sys.argv[2]),
    )
    config = dataclasses.replace(config, network=network)
packed = sys.argv[3] == "packed"
lm = scoring_model(config.network.language_model)
arrays, results = {}, {}
for name, (n, model) in {"one": (1, 1), "data2_model4": (8, 4)}.items():
    mesh = make_mesh(n, model=model)
    trained = OnPolicyModel(*language_model_training(config, TEXT, 10, row_constraint(mesh)))
    abstract = jax.eval_shape(
        trained.train_state, trained.param_shapes, jax.ShapeDtypeStruct((2,), jnp.uint32)
    )
    check_model_axis_divides(abstract.params, model)
    shardings = state_shardings(mesh, abstract)
    update = jit_sharded_update(trained.update, mesh, shardings, None, False, packed)
    params = trained.init_params(jax.random.PRNGKey(0))
    rollout = make_text_rollout(lm, params, seed=0)
    if packed:  # as the learner packs them: rows split over the data axis, whole messages
        rows = lambda x: x.reshape((-1,) + x.shape[2:])
        plan = packed_minibatches(
            rows(rollout["obs"]), rows(rollout["action"]), rows(rollout["valid"]) > 0,
            TEXT.pad_id, TEXT.eos_id, TEXT.context_length + TEXT.response_length,
            config.algorithm.num_epochs, config.algorithm.num_minibatches,
            np.random.default_rng(0), row_multiple=mesh.shape[BATCH_AXIS],
        )
        rollout = rollout | plan
    state = initial_state(
        trained, mesh, shardings, jax.random.PRNGKey(0), jax.random.PRNGKey(1)
    )
    for _ in range(3):
        # Behaviour log-probs and values of the current policy, as the env ranks' next rollout
        # would carry: every update starts on-policy and has policy gradients.
        state, metrics = update(state, rescored(lm, state.params, rollout))
    adam = next(
        s for s in jax.tree.leaves(
            state.opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)
        )
        if isinstance(s, optax.ScaleByAdamState)
    )
    parts = {"params": state.params, "ref_params": state.ref_params, "adam_mu": adam.mu,
             "adam_nu": adam.nu}
    held, per_device = {}, {}
    for part, tree in parts.items():
        leaves = jax.tree.leaves(tree)
        total = sum(leaf.size for leaf in leaves)
        held[part] = sum(leaf.addressable_shards[0].data.size for leaf in leaves) / total
        counts = {}
        for leaf in leaves:
            for shard in leaf.addressable_shards:
                counts[shard.device.id] = counts.get(shard.device.id, 0) + shard.data.size
        per_device[part] = sorted(counts.values())
    for i, leaf in enumerate(jax.tree.leaves(state.params)):
        arrays[f"{name}/params/{i}"] = np.asarray(leaf)
    for i, leaf in enumerate(jax.tree.leaves(state.ref_params)):
        arrays[f"{name}/ref_params/{i}"] = np.asarray(leaf)
    for i, leaf in enumerate(jax.tree.leaves(params)):
        arrays[f"{name}/initial/{i}"] = np.asarray(leaf)
    results[name] = {
        "mesh_shape": dict(mesh.shape),
        "update_count": int(state.update_count),
        "metrics": {k: float(v) for k, v in metrics.items()},
        "held_fraction": held,
        "per_device": per_device,
        "param_count": sum(leaf.size for leaf in jax.tree.leaves(state.params)),
        "packed_rows": rollout["packed_tokens"].shape[2] if packed else 0,
    }
np.savez(sys.argv[1], **arrays)
print("RESULT" + json.dumps(results))
"""


def _llama_folder(folder) -> str:
    """A tiny random Llama over the byte vocabulary (260 rows, as `TEXT`), saved by
    transformers, with widths that a 4-way model axis divides."""
    transformers = require_reference("transformers")
    torch = require_reference("torch")
    config = transformers.LlamaConfig(
        vocab_size=260,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


def _run_with_eight_host_devices(script: str, out: str, *args: str) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", script, out, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


@pytest.mark.parametrize(
    "family, packing",
    [("from_scratch", ""), ("llama", ""), ("llama", "packed")],
    ids=["from_scratch", "llama", "llama_packed"],
)
def test_token_ppo_update_on_a_data2_model4_mesh_equals_one_device_and_shards_the_state(
    family, packing, tmp_path
):
    out = tmp_path / "arrays.npz"
    folder = _llama_folder(tmp_path / "llama") if family == "llama" else ""
    results = _run_with_eight_host_devices(SCRIPT, str(out), folder, packing)
    arrays = np.load(out)
    one, fsdp = results["one"], results["data2_model4"]
    if packing:
        # The data axis's two devices split each minibatch's packed rows: an even count.
        assert fsdp["packed_rows"] % 2 == 0 and fsdp["packed_rows"] >= one["packed_rows"] > 0
        spec = rollout_shardings(make_mesh(1), True, True)["packed_tokens"].spec
        assert spec == PartitionSpec(None, None, "data")
    assert one["mesh_shape"] == {"data": 1} and fsdp["mesh_shape"] == {"data": 2, "model": 4}
    assert one["update_count"] == fsdp["update_count"] == 3
    leaves = sorted({key.split("/", 2)[2] for key in arrays if key.startswith("one/params/")})
    assert len(leaves) > 10
    moved = 0.0
    for part in ("params", "ref_params"):
        for i in leaves:
            a, b = arrays[f"one/{part}/{i}"], arrays[f"data2_model4/{part}/{i}"]
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=f"{part}/{i}")
    for i in leaves:
        initial = arrays[f"one/initial/{i}"]
        np.testing.assert_array_equal(arrays[f"one/ref_params/{i}"], initial)
        moved = max(moved, float(np.abs(arrays[f"one/params/{i}"] - initial).max()))
    # The updates moved the parameters, so their agreement means something.
    assert moved > 1e-4 and one["metrics"]["grad_norm"] > 0
    assert one["metrics"]["clip_fraction"] < 0.9
    assert one["metrics"].keys() == fsdp["metrics"].keys()
    for name, value in one["metrics"].items():
        np.testing.assert_allclose(fsdp["metrics"][name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    # Each device holds about a quarter of every parameter-shaped tree: the matrices are split
    # four ways, the vectors (biases, norms) replicated.
    for part, fraction in fsdp["held_fraction"].items():
        assert 0.25 <= fraction <= 0.3, (part, fraction)
        per_device = fsdp["per_device"][part]
        assert len(per_device) == 8 and len(set(per_device)) == 1, (part, per_device)
        assert per_device[0] == round(fraction * one["param_count"])
    assert one["held_fraction"] == {part: 1.0 for part in fsdp["held_fraction"]}
