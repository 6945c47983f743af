"""`agentenv eval` given a folder that is not a run: a sweep folder names its trials' run
folders instead of the generic error."""

from __future__ import annotations

import pytest

from agentenv_jax.checkpoint.store import CheckpointError
from agentenv_jax.workflow.cli import main
from agentenv_jax.workflow.evaluation import evaluate


def _sweep_folder(tmp_path, trials):
    """A sweep folder as the sweep leaves it: its sweep.yaml and a run folder per trial."""
    folder = tmp_path / "cartpole_ppo_lr"
    (folder / "trials").mkdir(parents=True)
    (folder / "sweep.yaml").write_text("name: cartpole_ppo_lr\n")
    for name in trials:
        (folder / "trials" / name).mkdir()
        (folder / "trials" / name / "config.yaml").write_text("{}\n")
    return folder


def test_eval_of_a_sweep_folder_names_its_trials(tmp_path, capsys):
    folder = _sweep_folder(tmp_path, ["c01-seed0", "c00-seed0", "c00-seed1"])
    assert main(["eval", str(folder)]) == 2
    error = capsys.readouterr().err
    assert f"{folder} is a sweep folder, not a run" in error
    assert f"agentenv eval {folder / 'trials' / 'c00-seed0'}" in error
    assert f"agentenv eval {folder / 'trials' / 'c00-seed1'}" in error
    assert "c01-seed0" not in error and "(and 1 more)" in error


def test_eval_of_a_sweep_without_trials_and_of_another_folder(tmp_path):
    with pytest.raises(CheckpointError, match="is a sweep folder, not a run.*none has started"):
        evaluate(_sweep_folder(tmp_path, []))
    with pytest.raises(CheckpointError, match="is not a run directory"):
        evaluate(tmp_path)
