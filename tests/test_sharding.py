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

from conftest import REPO

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
