"""PPO and SAC updates give the same result on 1 device and on an 8-device mesh.

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

from conftest import REPO, agentenv_command, run_command, settings

pytestmark = pytest.mark.slow  # every test here starts a process

SCRIPT = r"""
import json
import jax, numpy as np
from agentenv_jax.learner.loop import jit_sharded_update
from agentenv_jax.networks import action_distribution
from agentenv_jax.algorithms.ppo import make_ppo_update
from agentenv_jax.parallel.mesh import make_mesh, replicated, row_constraint
from test_ppo import make_rollout, make_update_setup

assert len(jax.devices()) == 8, jax.devices()
rollout = make_rollout(np.random.default_rng(7), 16, 8, 4, 3)
results = {}
for n in (1, 8):
    apply_fn, optimizer, hp, state = make_update_setup(num_minibatches=2, seed=3)
    mesh = make_mesh(n)
    update = jit_sharded_update(
        make_ppo_update(apply_fn, action_distribution("discrete"), optimizer, hp,
                        constrain_rows=row_constraint(mesh)), mesh)
    state = jax.device_put(state, replicated(mesh))
    for _ in range(3):
        state, metrics = update(state, rollout)
    leaf = jax.tree.leaves(state.params)[0]
    results[n] = {
        "params": [np.asarray(x).tolist() for x in jax.tree.leaves(state.params)],
        "metrics": {k: float(v) for k, v in metrics.items()},
        "devices": len(leaf.sharding.device_set),
        "replicated": bool(leaf.sharding.is_fully_replicated),
    }
print("RESULT" + json.dumps(results))
"""


SAC_SCRIPT = r"""
import json
import jax, numpy as np, optax
from jax.sharding import NamedSharding, PartitionSpec
from agentenv_jax.algorithms.sac import SACHyperparams, init_sac_state, make_sac_update
from agentenv_jax.networks.sac_networks import make_sac_networks
from agentenv_jax.parallel.mesh import BATCH_AXIS, make_mesh, replicated, row_constraint

rng = np.random.default_rng(5)
batch = {"obs": rng.normal(size=(64, 3)).astype(np.float32),
         "action": rng.uniform(-1, 1, size=(64, 2)).astype(np.float32),
         "reward": rng.normal(size=64).astype(np.float32),
         "next_obs": rng.normal(size=(64, 3)).astype(np.float32),
         "discount": np.full(64, 0.99, np.float32),
         "weight": rng.uniform(0.5, 1, 64).astype(np.float32)}
nets = make_sac_networks((3,), 2, (16,), (16,), "relu")
results = {}
for n in (1, 8):
    mesh = make_mesh(n)
    opts = [optax.adam(1e-3) for _ in range(3)]
    actor, critic = nets.init(jax.random.PRNGKey(0))
    state = jax.device_put(init_sac_state(actor, critic, *opts, 1.0, jax.random.PRNGKey(1)),
                           replicated(mesh))
    rows = NamedSharding(mesh, PartitionSpec(BATCH_AXIS))
    update = jax.jit(
        make_sac_update(nets.actor_apply, nets.critic_apply, *opts, SACHyperparams(0.01, -2.0),
                        constrain_rows=row_constraint(mesh)),
        in_shardings=(replicated(mesh), rows),
        out_shardings=(replicated(mesh), replicated(mesh), rows))
    for _ in range(3):
        state, metrics, td = update(state, batch)
    leaf = jax.tree.leaves(state.critic_params)[0]
    results[n] = {"params": [np.asarray(x).tolist() for x in jax.tree.leaves(state.critic_params)],
                  "td": np.asarray(td).tolist(), "devices": len(td.sharding.device_set),
                  "replicated": bool(leaf.sharding.is_fully_replicated)}
print("RESULT" + json.dumps(results))
"""


ONE_PSUM_SCRIPT = r"""
import json
import jax, numpy as np
from agentenv_jax.algorithms.ppo import make_ppo_update
from agentenv_jax.learner.loop import jit_sharded_update
from agentenv_jax.networks import action_distribution
from agentenv_jax.parallel.mesh import BATCH_AXIS, make_mesh, replicated
from test_ppo import make_rollout, make_update_setup

assert len(jax.devices()) == 8, jax.devices()
rng = np.random.default_rng(13)
rollouts = [make_rollout(rng, 16, 8, 4, 3) for _ in range(2)]
for rollout in rollouts:  # invalid rows, unevenly over the envs: shards count apart
    rollout["valid"][:7, 1] = 0
    rollout["valid"][10:, 6] = 0
    rollout["valid"][4, 3] = 0
distribution = action_distribution("discrete")
results = {}
for n in (1, 2, 4, 8):
    apply_fn, optimizer, hp, state = make_update_setup(num_minibatches=1, seed=6)
    if n == 1:  # the one-device update on the whole batch: no mesh, no data_axis
        update = jax.jit(make_ppo_update(apply_fn, distribution, optimizer, hp))
    else:
        mesh = make_mesh(n)
        update = jit_sharded_update(
            make_ppo_update(apply_fn, distribution, optimizer, hp, data_axis=BATCH_AXIS),
            mesh, data_axis=BATCH_AXIS)
        state = jax.device_put(state, replicated(mesh))
    for rollout in rollouts:
        state, metrics = update(state, rollout)
    leaf = jax.tree.leaves(state.params)[0]
    results[n] = {
        "params": [np.asarray(x).tolist() for x in jax.tree.leaves(state.params)],
        "metrics": {k: float(v) for k, v in metrics.items()},
        "devices": len(leaf.sharding.device_set),
        "replicated": bool(leaf.sharding.is_fully_replicated),
    }
print("RESULT" + json.dumps(results))
"""


MODEL_AXIS_SCRIPT = r"""
import json
import jax, numpy as np
from agentenv_jax.learner.loop import jit_sharded_update
from agentenv_jax.networks import action_distribution
from agentenv_jax.algorithms.ppo import make_ppo_update
from agentenv_jax.parallel.mesh import make_mesh, place_on_mesh, row_constraint
from agentenv_jax.parallel.partitioning import check_model_axis_divides, state_shardings
from test_ppo import make_rollout, make_update_setup

rollout = make_rollout(np.random.default_rng(7), 16, 8, 4, 3)
results = {}
for name, (n, model) in {"one": (1, 1), "data2_model4": (8, 4)}.items():
    apply_fn, optimizer, hp, state = make_update_setup(num_minibatches=2, seed=3, hidden=(64, 64))
    mesh = make_mesh(n, model=model)
    shardings = state_shardings(mesh, state)
    update = jit_sharded_update(
        make_ppo_update(apply_fn, action_distribution("discrete"), optimizer, hp,
                        constrain_rows=row_constraint(mesh)), mesh, shardings)
    state = place_on_mesh(mesh, state, shardings)
    for _ in range(3):
        state, metrics = update(state, rollout)
    leaves = jax.tree.leaves(state.params)
    params_per_device = {}
    for leaf in leaves:
        for shard in leaf.addressable_shards:
            key = shard.device.id
            params_per_device[key] = params_per_device.get(key, 0) + shard.data.size
    results[name] = {
        "params": [np.asarray(x).tolist() for x in leaves],
        "shapes": [list(x.shape) for x in leaves],
        "shard_shapes": [list(x.sharding.shard_shape(x.shape)) for x in leaves],
        "param_count": sum(x.size for x in leaves),
        "params_per_device": sorted(params_per_device.values()),
        "mesh_shape": dict(mesh.shape),
        "metrics": {k: float(v) for k, v in metrics.items()},
    }
errors = {}
for model in (3, 5):
    try:
        check_model_axis_divides(make_update_setup(hidden=(64, 64))[3].params, model)
    except ValueError as err:
        errors[model] = str(err)
results["errors"] = errors
print("RESULT" + json.dumps(results))
"""


def _run_with_eight_host_devices(script: str) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


def test_sac_update_equal_on_one_and_eight_host_devices():
    results = _run_with_eight_host_devices(SAC_SCRIPT)
    one, eight = results["1"], results["8"]
    assert eight["devices"] == 8 and eight["replicated"]  # rows split, parameters replicated
    for a, b in zip(one["params"], eight["params"], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(one["td"], eight["td"], rtol=1e-4, atol=1e-5)


def test_update_equal_on_one_and_eight_host_devices():
    results = _run_with_eight_host_devices(SCRIPT)
    one, eight = results["1"], results["8"]
    assert one["devices"] == 1 and eight["devices"] == 8
    assert eight["replicated"], "parameters must stay replicated over the mesh"
    for a, b in zip(one["params"], eight["params"], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
    for name, value in one["metrics"].items():
        np.testing.assert_allclose(
            eight["metrics"][name], value, rtol=1e-4, atol=1e-6, err_msg=name
        )
    # The update must actually have moved the parameters for the comparison to mean anything.
    assert one["metrics"]["grad_norm"] > 0


def test_one_psum_update_on_2_4_and_8_host_devices_equals_the_one_device_update():
    """`data_axis`'s update (`gradient_sync: one_psum`) under `shard_map` on meshes of 2, 4 and
    8 host devices against the plain update of the whole batch on one device, which shares
    none of its cross-shard sums. With one minibatch per epoch every shard's rows meet in each
    step, so the two agree (docs/learners.md): the valid rows the losses divide by and the
    advantages' moments are summed over the shards, and so are the gradients. Invalid rows
    are spread unevenly, so that a shard's own count or moments would show; two updates in a
    row, three epochs each, advantages standardized."""
    results = _run_with_eight_host_devices(ONE_PSUM_SCRIPT)
    one = results["1"]
    assert one["devices"] == 1 and one["metrics"]["grad_norm"] > 0
    assert one["metrics"]["trained_rows"] == 16 * 8 - 7 - 6 - 1
    for n in ("2", "4", "8"):
        sharded = results[n]
        assert sharded["devices"] == int(n) and sharded["replicated"], n
        for a, b in zip(one["params"], sharded["params"], strict=True):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=2e-6)
        for name, value in one["metrics"].items():
            np.testing.assert_allclose(
                sharded["metrics"][name], value, rtol=1e-4, atol=1e-6, err_msg=f"{n}: {name}"
            )


def test_update_on_a_data2_model4_mesh_equals_one_device_and_shards_the_parameters():
    results = _run_with_eight_host_devices(MODEL_AXIS_SCRIPT)
    one, fsdp = results["one"], results["data2_model4"]
    assert fsdp["mesh_shape"] == {"data": 2, "model": 4}
    for a, b in zip(one["params"], fsdp["params"], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
    for name, value in one["metrics"].items():
        np.testing.assert_allclose(fsdp["metrics"][name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    assert one["metrics"]["grad_norm"] > 0
    # Every weight matrix is split four ways along its largest dimension; vectors replicated.
    for shape, shard in zip(fsdp["shapes"], fsdp["shard_shapes"], strict=True):
        if len(shape) >= 2:
            axis = int(np.argmax(shape))
            assert shard[axis] * 4 == shape[axis] and sum(shard) < sum(shape), (shape, shard)
        else:
            assert shard == shape
    # So each of the 8 devices holds about a quarter of the parameters.
    per_device = fsdp["params_per_device"]
    assert len(per_device) == 8 and len(set(per_device)) == 1
    assert 0.25 <= per_device[0] / fsdp["param_count"] < 0.3
    assert one["params_per_device"] == [one["param_count"]]
    # A model size that does not divide a layer is refused, naming the layer.
    for model in ("3", "5"):
        assert (
            f"topology.mesh.model = {model} is not allowed: it must divide the largest "
            in (results["errors"][model])
        )
        assert "/kernel has shape [" in results["errors"][model]


@pytest.mark.parametrize(
    ("mesh", "outcome"),
    [
        ("{data: 2, model: 4}", "8 learner device(s) (data 2 x model 4)"),
        ("{data: 4, model: 4}", "topology.mesh = {data: 4, model: 4} is not allowed: it needs 16"),
        ("{model: 3}", "topology.mesh.model = 3 is not allowed: it must divide the largest"),
    ],
    ids=["trains", "more_devices_than_there_are", "model_axis_not_dividing_a_layer"],
)
def test_training_on_a_2d_mesh_and_its_start_up_errors(run_dir, mesh, outcome):
    """`agentenv train` with `topology.mesh` on 8 host devices: a data x model mesh trains,
    meshes that cannot be built are one clear error."""
    proc = run_command(
        agentenv_command(
            "train",
            "cartpole_ppo",
            *settings(
                f"topology.mesh={mesh}",
                f"run.run_dir={run_dir}",
                "run.name=mesh",
                "run.total_env_steps=1024",
                "run.progress=false",
            ),
        ),
        timeout=240,
        cwd=REPO,
        extra_env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
    )
    if outcome.startswith("topology.mesh"):
        assert proc.returncode != 0
        assert outcome in proc.stderr and proc.stderr.count("agentenv: error:") == 1, proc.stderr[
            -3000:
        ]
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "mesh" / "summary.json").read_text())
    assert summary["topology"].endswith(outcome)
    assert summary["env_steps"] >= 1024 and summary["accounting"]["reconciles"]
