"""Many env ranks on few cores: 1 learner + 15 env ranks (16 processes on this 2-core machine)
run to the end with exact accounting, and the summary reports what each env rank burned."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, agentenv_command, mpiexec_path, run_command, settings


@pytest.mark.slow
def test_one_learner_and_fifteen_env_ranks_finish_with_exact_accounting(run_dir):
    proc = run_command(
        [
            mpiexec_path(),
            "-n",
            "16",
            *agentenv_command(
                "train",
                "cartpole_ppo",
                *settings(
                    f"run.run_dir={run_dir}",
                    "run.name=many",
                    "run.progress=false",
                    "env.global_num_envs=15",
                    "run.total_env_steps=15000",
                ),
            ),
        ],
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((run_dir / "many" / "summary.json").read_text())
    assert summary["topology"].startswith("1 learner + 15 env rank(s), 15 envs")
    accounting = summary["accounting"]
    assert accounting["reconciles"] and accounting["unsent"] == accounting["late"] == 0
    assert accounting["produced"] == accounting["trained"] == summary["env_steps"] >= 15000
    shares = summary["env_rank_cpu_share"]
    assert len(shares) == 15 and all(0.0 < share < 1.5 for share in shares)
