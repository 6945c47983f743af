"""`env.backend: jax` (gymnax envs inside the learner's jit): the env adapter, learning, one
update on 1 and 8 devices, resume, and the start-up errors."""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_sharding import _run_with_eight_host_devices

from agentenv_jax.checkpoint import CheckpointError
from agentenv_jax.config import ConfigError, load_config
from agentenv_jax.config.errors import import_failure
from agentenv_jax.envs.jax_envs import make_jax_env
from agentenv_jax.envs.spaces import EnvError
from agentenv_jax.metrics.logger import read_metrics
from agentenv_jax.runtime.launch import train
from agentenv_jax.workflow.evaluation import evaluate

from conftest import (
    EXPERIMENTS,
    agentenv_command,
    mpiexec_path,
    read_events,
    run_command,
    settings,
)

CARTPOLE_JAX = EXPERIMENTS / "cartpole_ppo_jax.yaml"
THRESHOLD, BUDGET = 475.0, 100_000


@pytest.mark.slow
def test_adapter_tracks_episodes_and_tells_truncation_from_termination():
    """With a 15-step limit, alternating pushes keep CartPole up until the limit truncates the
    episode; pushing right makes it fall (terminate) sooner. Returns and lengths are reported
    on the step an episode ends, the carry restarts, and `final_obs` is the state reached."""
    env = make_jax_env(load_config(None, ["env.backend=jax", "env.max_episode_steps=15"]).env)
    step = jax.jit(env.step)
    carry = env.reset(jax.random.split(jax.random.PRNGKey(0), 2))
    results = []
    for t in range(30):
        keys = jax.random.split(jax.random.PRNGKey(t + 1), 2)
        before = np.asarray(carry.obs)
        carry, result = step(keys, carry, jnp.array([t % 2, 1], jnp.int32))
        result = jax.device_get(result)
        results.append(result)
        ended = result.terminated | result.truncated
        # A continuing episode goes on from the state reached; an ended one restarts.
        np.testing.assert_array_equal(np.asarray(carry.obs)[~ended], result.final_obs[~ended])
        assert np.all(np.abs(np.asarray(carry.obs)[ended]) <= 0.05)  # a fresh reset state
        assert not np.any(np.all(before == result.final_obs, axis=-1))
    terminated, truncated, lengths, returns, rewards = (
        np.array([getattr(r, name) for r in results])
        for name in ("terminated", "truncated", "episode_length", "episode_return", "reward")
    )
    assert truncated[:, 0].tolist() == [t in (14, 29) for t in range(30)]
    assert not terminated[:, 0].any() and not truncated[:, 1].any()
    assert terminated[:, 1].sum() >= 2
    ended = terminated | truncated
    assert np.all(lengths[~ended] == 0) and np.all(returns[~ended] == 0)
    for env_index in (0, 1):  # each episode's length and return, counted from the last end
        ends = np.flatnonzero(ended[:, env_index])
        np.testing.assert_array_equal(lengths[ends, env_index], np.diff(ends, prepend=-1))
        sums = [
            rewards[a + 1 : b + 1, env_index].sum()
            for a, b in zip([-1, *ends[:-1]], ends, strict=True)
        ]
        np.testing.assert_allclose(returns[ends, env_index], sums)


@pytest.mark.slow
def test_gymnax_cartpole_reaches_threshold_in_one_process(run_dir):
    config = load_config(
        CARTPOLE_JAX,
        [f"run.run_dir={run_dir}", "run.name=anakin", f"run.stop_at_return={THRESHOLD}"],
    )
    result = train(config)
    assert result.episode_return_mean >= THRESHOLD
    assert result.env_steps <= BUDGET
    acc = result.accounting
    assert acc["reconciles"] and acc["produced"] == acc["trained"] == result.env_steps
    records = read_metrics(result.run_dir / "metrics.jsonl")
    assert [r["update"] for r in records] == list(range(1, result.updates + 1))
    for key in ("episode_length_mean", "loss/policy", "loss/value", "approx_kl", "clip_fraction"):
        assert records[-1][key] is not None, key
    timings = read_metrics(result.run_dir / "timings.jsonl")
    assert timings[-1]["steps_per_s"] > 0 and timings[-1]["time/learner_update_s"] > 0
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["topology"] == "1 process, 8 JAX envs on 1 device(s)"
    # The saved policy plays as well in `agentenv eval` (deterministic, fresh env keys).
    evaluation = evaluate(result.run_dir, episodes=4)
    assert evaluation.checkpoint == result.updates and evaluation.mean >= THRESHOLD


@pytest.mark.slow
def test_impala_runs_on_jax_envs_with_lag_zero(run_dir):
    config = load_config(
        EXPERIMENTS / "cartpole_impala.yaml",
        [
            f"run.run_dir={run_dir}",
            "run.name=impala",
            "env.backend=jax",
            "env.normalize_reward=false",  # not kept inside the jit: refused with the jax backend
            "run.total_env_steps=1",
        ],
    )
    result = train(config)
    assert result.updates == 1 and result.env_steps == 32 * 16
    assert result.accounting["reconciles"]
    [record] = read_metrics(result.run_dir / "metrics.jsonl")
    assert record["policy_lag_max"] == 0 and np.isfinite(record["loss/policy"])
    assert record["importance_weight_mean"] == pytest.approx(1.0)  # acted with these params


EIGHT_DEVICES_SCRIPT = r"""
import json
import jax, numpy as np
from agentenv_jax.config import load_config
from agentenv_jax.envs.jax_envs import make_jax_env
from agentenv_jax.learner.anakin import build_anakin

assert len(jax.devices()) == 8, jax.devices()
# 20-step episodes in a 32-step rollout: terminations, truncations and auto-resets all happen.
config = load_config("cartpole_ppo_jax", ["env.global_num_envs=16", "algorithm.num_minibatches=2",
                                          "env.max_episode_steps=20"])
jax_env = make_jax_env(config.env)
results = {}
for n in (1, 8):
    anakin = build_anakin(config, jax_env, n)
    state, out = anakin.step(anakin.state)
    out = jax.device_get(out)
    results[n] = {
        "params": [np.asarray(x).tolist() for x in jax.tree.leaves(state.params)],
        "obs": np.asarray(state.envs.obs).tolist(),
        "lengths": out["episode_length"].tolist(),
        "metrics": {k: float(v) for k, v in out["metrics"].items()},
        "env_devices": len(state.envs.obs.sharding.device_set),
        "replicated": bool(jax.tree.leaves(state.params)[0].sharding.is_fully_replicated),
    }
print("RESULT" + json.dumps(results))
"""


@pytest.mark.slow
def test_one_update_equal_on_one_and_eight_host_devices():
    results = _run_with_eight_host_devices(EIGHT_DEVICES_SCRIPT)
    one, eight = results["1"], results["8"]
    assert one["env_devices"] == 1 and eight["env_devices"] == 8  # each device steps 2 envs
    assert eight["replicated"]
    lengths = np.asarray(one["lengths"])
    assert np.any(lengths == 20) and np.any((lengths > 0) & (lengths < 20))  # both ways to end
    # The same episodes were played, and the same update came of them.
    assert eight["lengths"] == one["lengths"]
    np.testing.assert_allclose(eight["obs"], one["obs"], rtol=1e-5, atol=1e-6)
    for a, b in zip(one["params"], eight["params"], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
    for name, value in one["metrics"].items():
        np.testing.assert_allclose(
            eight["metrics"][name], value, rtol=1e-4, atol=1e-6, err_msg=name
        )
    assert one["metrics"]["grad_norm"] > 0


def _quick(run_dir, name: str, *extra: str) -> list[str]:
    """A short run with constant schedules: its updates do not depend on the run's length."""
    return [
        f"run.run_dir={run_dir}",
        f"run.name={name}",
        "run.progress=false",
        "algorithm.rollout_length=16",
        "algorithm.lr_schedule=constant",
        "algorithm.clip_schedule=constant",
        *extra,
    ]


@pytest.mark.slow
def test_resume_continues_the_run_as_if_never_stopped(run_dir):
    """8 updates, then resumed to 16, equal one uninterrupted run of 16 (the envs' mid-episode
    state is in the checkpoint); counters continue and the accounting covers the whole run."""
    whole = train(load_config(CARTPOLE_JAX, _quick(run_dir, "whole", "run.total_env_steps=2048")))
    first = train(load_config(CARTPOLE_JAX, _quick(run_dir, "split", "run.total_env_steps=1024")))
    assert first.updates == 8 and first.env_steps == 1024
    resumed = train(
        load_config(CARTPOLE_JAX, _quick(run_dir, "split", "run.total_env_steps=2048")),
        resume=True,
    )
    assert resumed.updates == whole.updates == 16 and resumed.env_steps == 2048
    acc = resumed.accounting
    assert acc["reconciles"] and acc["produced"] == acc["trained"] == 2048
    split = read_metrics(resumed.run_dir / "metrics.jsonl")
    assert [r["update"] for r in split] == list(range(1, 17))
    assert split == read_metrics(whole.run_dir / "metrics.jsonl")
    events = read_events(resumed.run_dir)
    [resume] = [e for e in events if e["event"] == "resume"]
    saved = [e for e in events if e["event"] == "checkpoint" and e["update"] == 8]
    assert resume["update"] == 8 and resume["state_checksum"] == saved[-1]["state_checksum"]


@pytest.mark.slow
def test_resume_with_another_env_count_is_refused(run_dir):
    train(load_config(CARTPOLE_JAX, _quick(run_dir, "r", "run.total_env_steps=128")))
    config = load_config(CARTPOLE_JAX, _quick(run_dir, "r", "env.global_num_envs=4"))
    with pytest.raises(CheckpointError, match="env.global_num_envs = 8; this config has 4"):
        train(config, resume=True)


BAD_INPUTS = {
    "unknown_id": (
        ["env.id=CartPol-v1"],
        EnvError,
        "env.id = 'CartPol-v1' is not a registered gymnax environment (did you mean "
        "'CartPole-v1'?)",
    ),
    "gymnasium_only_id": (
        ["env.id=agentenv_jax/Catch-v0"],
        EnvError,
        "env.id = 'agentenv_jax/Catch-v0' is not a registered gymnax environment",
    ),
    "sac": (
        ["algorithm={name: sac}"],
        ConfigError,
        "algorithm.name = 'sac' is not allowed with env.backend = 'jax': expected one of "
        "'ppo', 'impala'",
    ),
    "async_vectorization": (
        ["env.vectorization=async"],
        ConfigError,
        "env.vectorization = 'async' is not allowed with env.backend = 'jax'",
    ),
    "normalized_observations": (
        ["env.normalize_obs=true"],
        ConfigError,
        "env.normalize_obs = true is not allowed with env.backend = 'jax'",
    ),
    "kwargs_the_env_rejects": (
        ["env.kwargs={gravity: 3}"],
        EnvError,
        "env.id = 'CartPole-v1' with env.kwargs = {'gravity': 3}: gymnax.make failed: TypeError",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=list(BAD_INPUTS))
def test_bad_input_is_one_clear_error_before_anything_is_written(case, run_dir):
    overrides, error, message = BAD_INPUTS[case]
    config = load_config(CARTPOLE_JAX, [f"run.run_dir={run_dir}", "run.name=bad", *overrides])
    with pytest.raises(error) as raised:
        train(config)
    assert message in str(raised.value)
    assert not (run_dir / "bad").exists()


def test_without_gymnax_the_error_says_what_to_install(run_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnax", None)  # `import gymnax` now raises ImportError
    config = load_config(CARTPOLE_JAX, [f"run.run_dir={run_dir}", "run.name=bad"])
    with pytest.raises(
        ConfigError,
        match=r"needs gymnax, which is not installed: pip install 'agentenv_jax\[jax-envs\]'$",
    ):
        train(config)


def test_import_failure_tells_a_missing_package_from_one_that_fails_to_import():
    gone = ModuleNotFoundError("No module named 'gymnax'", name="gymnax")
    assert import_failure("gymnax", gone) == "which is not installed"
    assert import_failure("gymnax.environments", gone) == "which is not installed"
    six = ModuleNotFoundError("No module named 'six'", name="six")
    assert import_failure("gymnax", six) == (
        "which is installed but fails to import (ModuleNotFoundError: No module named 'six')"
    )
    inner = ModuleNotFoundError("No module named 'gymnax.utils'", name="gymnax.utils")
    assert import_failure("gymnax", inner).startswith("which is installed but fails to import")
    broken = AttributeError("module 'jax' has no attribute 'tree_map'")
    assert import_failure("gymnax", broken) == (
        "which is installed but fails to import "
        "(AttributeError: module 'jax' has no attribute 'tree_map')"
    )


# `python -c`: `six` made unimportable (None in sys.modules), as in a venv where nothing brought
# it, then the `agentenv` CLI; gymnax itself is installed and imports six.
_WITHOUT_SIX = """
import sys
sys.modules["six"] = None
from agentenv_jax.workflow.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_an_installed_gymnax_that_fails_to_import_is_named_with_its_error(tmp_path):
    """An installed gymnax whose own import fails is not reported as missing: the message
    says it is installed and gives the error its import raised."""
    proc = run_command(
        [sys.executable, "-c", _WITHOUT_SIX, "train", "cartpole_ppo_jax"]
        + settings(f"run.run_dir={tmp_path}", "run.name=bad"),
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        "agentenv: error: env.backend = 'jax' needs gymnax, which is installed but fails to "
        "import (ModuleNotFoundError: No module named 'six"
    ) in proc.stderr, proc.stderr[-3000:]
    assert "pip install 'agentenv_jax[jax-envs]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_under_mpiexec_with_two_ranks_every_rank_stops_naming_the_backend(tmp_path):
    proc = run_command(
        [
            mpiexec_path(),
            "-n",
            "2",
            *agentenv_command("train", str(CARTPOLE_JAX)),
            *settings("run.run_dir=runs", "run.name=mpi"),
        ],
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("agentenv: error: env.backend = 'jax' is not allowed with 2 MPI") == 1
    assert not (tmp_path / "runs").exists()
