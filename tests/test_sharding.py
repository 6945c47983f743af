"""The PPO update gives the same result on 1 device and on an 8-device mesh.

XLA's host-device count is fixed when the backend starts, so the comparison runs in a fresh
interpreter with `--xla_force_host_platform_device_count=8`; both meshes live in that process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

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


def test_update_equal_on_one_and_eight_host_devices():
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    results = json.loads(line[len("RESULT") :])
    one, eight = results["1"], results["8"]
    assert one["devices"] == 1 and eight["devices"] == 8
    assert eight["replicated"], "parameters must stay replicated over the mesh"
    import numpy as np

    for a, b in zip(one["params"], eight["params"], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
    for name, value in one["metrics"].items():
        np.testing.assert_allclose(
            eight["metrics"][name], value, rtol=1e-4, atol=1e-6, err_msg=name
        )
    # The update must actually have moved the parameters for the comparison to mean anything.
    assert one["metrics"]["grad_norm"] > 0
