"""The shipped experiments: found by name from any folder, listed, inside the wheel, and each
one trained for a tiny budget and evaluated (experiment_smoke.py; the pretrained language models'
and Atari's in modules of their own, so that pytest-xdist runs the three sets side by side)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from agentenv_jax.config import ConfigError, load_config

from conftest import EXPERIMENTS, REPO, agentenv_command, run_command, settings
from experiment_smoke import TRAINED_AS_SHIPPED, experiments, run_smoke


def test_a_name_is_the_shipped_file_and_a_misspelt_one_an_error_with_the_names():
    for path in EXPERIMENTS.glob("*.yaml"):
        assert load_config(path.stem) == load_config(path) == load_config(path.name)
    with pytest.raises(ConfigError, match=r"'cartpol_ppo' .* \(did you mean 'cartpole_ppo'\?\)"):
        load_config("cartpol_ppo")


@pytest.mark.slow
def test_list_and_train_by_name_from_another_folder(tmp_path):
    listed = run_command(agentenv_command("list"), timeout=60, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    experiments, sweeps = listed.stdout.split("\n\nsweeps (agentenv sweep NAME):\n")
    # Each entry starts a line; its description may go on, indented, on the lines below.
    names = [line.split()[0] for line in experiments.splitlines() if not line[:1].isspace()]
    assert names == sorted(p.stem for p in EXPERIMENTS.glob("*.yaml"))
    sweep_names = [line.split()[0] for line in sweeps.splitlines() if not line[:1].isspace()]
    assert sweep_names == sorted(p.stem for p in EXPERIMENTS.glob("sweeps/*.yaml"))
    proc = run_command(
        [
            *agentenv_command("train", "cartpole_ppo"),
            *settings("run.run_dir=runs", "run.name=by-name", "run.total_env_steps=512"),
        ],
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "by-name" / "summary.json").read_text())
    assert summary["env_steps"] == 512 and summary["accounting"]["reconciles"]


@pytest.mark.slow
def test_the_wheel_ships_every_module_and_experiment(tmp_path):
    """A plain (non-editable) install gets the experiments too: they are package data."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    [wheel] = tmp_path.glob("agentenv_jax-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = REPO / "agentenv_jax"
    modules = {str(p.relative_to(REPO)) for p in package.rglob("*.py")}
    experiments = {
        f"agentenv_jax/experiments/{p.relative_to(EXPERIMENTS)}"
        for p in [*EXPERIMENTS.glob("*.yaml"), *EXPERIMENTS.glob("sweeps/*.yaml")]
    }
    assert experiments and modules and (modules | experiments) <= names


def test_experiments_without_a_smoke_run_are_trained_as_shipped_and_evaluated_elsewhere():
    for name, test_file in TRAINED_AS_SHIPPED.items():
        assert (EXPERIMENTS / name).is_file(), name
        source = (REPO / test_file).read_text()
        assert f'"{name.removesuffix(".yaml")}"' in source, (name, test_file)
        assert "assert_final_checkpoint_plays(" in source, test_file


@pytest.mark.slow
@pytest.mark.parametrize("path", experiments("other"), ids=lambda p: p.name)
def test_every_experiment_runs_with_a_tiny_budget(path, run_dir):
    run_smoke(path, run_dir)
