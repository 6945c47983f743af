"""Where a policy acts and how many processes run a job do not change what it trains: central
inference under `mpiexec -n 3` (two env ranks' requests in one batch) trains as the env ranks'
own policies do, and a text run under `mpiexec -n 3` trains as the same run in one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, agentenv_command, mpi_launch, run_command, settings


def _train(run_dir: Path, name: str, experiment: str, *overrides: str, ranks: int = 1) -> Path:
    command = agentenv_command(
        "train",
        experiment,
        *settings(f"run.run_dir={run_dir}", f"run.name={name}", "run.progress=false", *overrides),
    )
    proc = run_command(
        [*mpi_launch(ranks), *command] if ranks > 1 else command, timeout=500, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir / name


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def _assert_same_training(a: list[dict], b: list[dict], keys: tuple[str, ...]) -> None:
    """Update by update: the same episodes (exactly) and the same losses (to float rounding:
    XLA may order a reduction differently for another batch layout)."""
    assert len(a) == len(b) > 1
    for left, right in zip(a, b, strict=True):
        assert left["env_steps"] == right["env_steps"]
        for key in keys:
            assert left[key] == right[key], (left["update"], key)
        assert left["loss/total"] == pytest.approx(right["loss/total"], rel=1e-5, abs=1e-7)


@pytest.mark.slow
def test_central_inference_batches_two_env_ranks_and_trains_as_their_own_policies(run_dir):
    """Catch's pixels through the Nature CNN, 1 learner + 2 env ranks: the server answers both
    env ranks' requests in one batch, drawing each env rank's own noise stream."""
    common = ("run.total_env_steps=4096", "topology.env_rank_inference=jit")
    own = _train(run_dir, "own", "catch_ppo", *common, "topology.inference=env_ranks", ranks=3)
    central = _train(
        run_dir, "central", "catch_ppo", *common, "topology.inference=learner", ranks=3
    )
    served = _summary(central)["central_inference"]
    assert _summary(central)["env_rank_policy_params"] == [0, 0]
    assert served["rows_per_act_batch"] > 8  # more rows than one env rank's 8 envs: batched
    _assert_same_training(_records(own), _records(central), ("episode_return_mean",))


@pytest.mark.slow
def test_a_text_run_under_mpiexec_trains_as_in_one_process(run_dir):
    """docs/text.md: `mpiexec -n 3 agentenv train arithmetic_ppo` (its 32 envs split over two
    env ranks) trains exactly as the one-process run, answer for answer."""
    steps = "run.total_env_steps=1280"  # 5 updates of 256 answers
    alone = _train(run_dir, "alone", "arithmetic_ppo", steps)
    job = _train(run_dir, "job", "arithmetic_ppo", steps, ranks=3)
    assert _summary(job)["topology"].startswith("1 learner + 2 env rank(s), 32 envs")
    _assert_same_training(_records(alone), _records(job), ("accuracy", "episode_return_mean"))
