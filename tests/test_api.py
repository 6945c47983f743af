"""The Python API: `agentenv_jax.train`, `load_run` and `evaluate`, as a notebook uses them."""

from __future__ import annotations

import subprocess
import sys

import jax
import numpy as np
import pytest

import agentenv_jax as ae
from agentenv_jax.config import ConfigError


@pytest.mark.slow
def test_train_load_and_evaluate_a_run(tmp_path):
    run = ae.train(
        "cartpole_ppo",
        run={"total_env_steps": 1024, "run_dir": str(tmp_path), "name": "api", "progress": False},
        overrides=["algorithm.num_epochs=2"],
    )
    assert run.run_dir == tmp_path / "api"
    assert run.config.algorithm.num_epochs == 2 and run.config.run.total_env_steps == 1024
    assert run.summary["env_steps"] == 1024 and run.summary["accounting"]["reconciles"]
    assert [r["update"] for r in run.records] == [1, 2, 3, 4]
    table = run.metrics()
    rows = table.reset_index().to_dict("records") if hasattr(table, "reset_index") else table
    assert [r["update"] for r in rows] == [1, 2, 3, 4]
    assert all("loss/policy" in r and "time/learner_update_s" in r for r in rows)

    # From disk, the same run: its config, records and the checkpoint's parameters.
    same = ae.load_run(run.run_dir)
    assert same.config == run.config and same.records == run.records
    assert same.summary == run.summary
    equal = jax.tree.map(np.array_equal, same.params, run.params)
    assert jax.tree.structure(same.params) == jax.tree.structure(run.params)
    assert all(jax.tree.leaves(equal))

    evaluation = ae.evaluate(run.run_dir, episodes=2)
    assert evaluation.checkpoint == 4 and len(evaluation.returns) == 2
    assert run.evaluate(episodes=2).returns == evaluation.returns  # same seeds, same policy


def test_bad_api_arguments_name_what_is_wrong(tmp_path):
    with pytest.raises(ConfigError, match=r"run = 5 is not allowed: expected a mapping"):
        ae.train(None, run=5)
    with pytest.raises(ConfigError, match=r"unknown key 'run.sead' \(did you mean 'seed'\?\)"):
        ae.train("cartpole_ppo", run={"sead": 1})
    with pytest.raises(ConfigError, match="is not a run folder"):
        ae.load_run(tmp_path)
    with pytest.raises(AttributeError, match="has no attribute 'trian'"):
        ae.trian  # noqa: B018


@pytest.mark.slow
def test_importing_the_package_stays_cheap():
    """Each MPI rank's supervisor imports the package: it must not pull in JAX."""
    code = "import sys, agentenv_jax; print('jax' in sys.modules, 'mpi4py' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.slow
def test_a_multi_rank_run_from_python_is_followed_and_returned(tmp_path, capsys):
    """`ranks=3` from a process without a launcher: an mpiexec job whose progress this process
    shows from the run's records, and the same `Run` back."""
    run = ae.train(
        "cartpole_ppo",
        ranks=3,
        run={"total_env_steps": 4096, "run_dir": str(tmp_path), "name": "job"},
    )
    assert run.run_dir == tmp_path / "job"
    assert run.summary["topology"].startswith("1 learner + 2 env rank(s)")
    assert run.summary["env_steps"] == 4096 and run.summary["accounting"]["reconciles"]
    assert len(run.records) == 16 and run.params is not None
    shown = capsys.readouterr().out
    assert "steps     4,096/4,096" in shown and "(reconciles)" in shown
    # The folder now holds a run: refused before any job starts.
    with pytest.raises(ConfigError, match="already holds a run"):
        ae.train("cartpole_ppo", ranks=3, run={"run_dir": str(tmp_path), "name": "job"})
    # A job that fails says why.
    with pytest.raises(RuntimeError, match="'CartPol-v1' is not a registered Gymnasium"):
        ae.train(
            "cartpole_ppo",
            ranks=3,
            env={"id": "CartPol-v1"},
            run={"run_dir": str(tmp_path), "name": "bad"},
        )
