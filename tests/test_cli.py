"""The `agentenv` commands that read a run or the schema: `eval` (of checkpoint K, on seed S,
sampling), `show-config` and `config-reference`. The eval tests share one short CartPole run
with a checkpoint every 4 updates."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest
import yaml

from agentenv_jax.config.loading import config_to_dict, load_config
from agentenv_jax.config.reference import config_reference
from agentenv_jax.config.schema import ExperimentConfig
from agentenv_jax.workflow.cli import main

from conftest import agentenv_command, run_command, settings

# 16 updates of 8 envs x 32 steps; a checkpoint every 4 updates, all four kept. After 16
# updates the policy balances for a couple of hundred steps; after 4 it falls within ~10.
UPDATES, EVERY = 16, 4
CHECKPOINTS = [4, 8, 12, 16]
EVAL_LINE = re.compile(
    r"checkpoint (\d+)  (\d+) episodes \((deterministic|sampled actions)\)  "
    r"return (\S+) ± (\S+)  length (\S+)"
)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    proc = run_command(
        agentenv_command(
            "train",
            "cartpole_ppo",
            *settings(
                f"run.total_env_steps={UPDATES * 256}",
                f"checkpoint.every_updates={EVERY}",
                "checkpoint.keep=10",
                f"run.run_dir={folder}",
                "run.name=cli",
                "run.progress=false",
            ),
        ),
        timeout=300,
        cwd=folder,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = folder / "cli"
    assert sorted(int(p.name) for p in (run / "checkpoints").iterdir()) == CHECKPOINTS
    return run


def _eval(capsys, run: Path, *args: str) -> tuple[int, int, str, float, float, float]:
    """`agentenv eval RUN ARGS`: (checkpoint, episodes, mode, mean, std, mean length)."""
    assert main(["eval", str(run), *args]) == 0
    out = capsys.readouterr().out
    match = EVAL_LINE.search(out)
    assert match, out
    checkpoint, episodes, mode, mean, std, length = match.groups()
    return int(checkpoint), int(episodes), mode, float(mean), float(std), float(length)


@pytest.mark.slow
def test_eval_checkpoint_k_plays_that_checkpoints_policy(trained_run, capsys):
    newest = _eval(capsys, trained_run, "--episodes", "5")
    assert newest[0] == CHECKPOINTS[-1]
    assert _eval(capsys, trained_run, "--episodes", "5", "--checkpoint", "16") == newest
    first = _eval(capsys, trained_run, "--episodes", "5", "--checkpoint", "4")
    assert first[0] == 4
    # Update 4's policy drops the pole within a few dozen steps, update 16's holds it far longer.
    assert first[3] < newest[3] / 2, (first, newest)


@pytest.mark.slow
def test_eval_of_a_checkpoint_not_kept_names_the_kept_ones(trained_run, capsys):
    assert main(["eval", str(trained_run), "--checkpoint", "5"]) == 2
    err = capsys.readouterr().err
    assert (
        f"agentenv: error: checkpoint = 5 is not in {trained_run / 'checkpoints'}: "
        f"kept are {CHECKPOINTS}"
    ) in err, err
    assert "Traceback" not in err


@pytest.mark.slow
def test_eval_seed_selects_the_env_seeds(trained_run, capsys):
    """Seed S plays env seeds 2^30 + S * episodes + i: one seed again is the same episodes,
    seeds 0 and 1 of 5 episodes are two different sets, and together the 10 episodes of
    seed 0 (deterministic play: each episode depends only on its env seed)."""
    seed0 = _eval(capsys, trained_run, "--episodes", "5", "--seed", "0")
    assert _eval(capsys, trained_run, "--episodes", "5") == seed0  # 0 is the default
    assert _eval(capsys, trained_run, "--episodes", "5", "--seed", "0") == seed0
    seed1 = _eval(capsys, trained_run, "--episodes", "5", "--seed", "1")
    assert seed1[3:5] != seed0[3:5], "seeds 0 and 1 played the same episodes"
    both = _eval(capsys, trained_run, "--episodes", "10", "--seed", "0")
    assert both[3] == pytest.approx((seed0[3] + seed1[3]) / 2, abs=0.01)


@pytest.mark.slow
def test_eval_sample_samples_actions_instead_of_the_mode(trained_run, capsys):
    mode = _eval(capsys, trained_run, "--episodes", "5")
    sampled = _eval(capsys, trained_run, "--episodes", "5", "--sample")
    assert mode[2] == "deterministic" and sampled[2] == "sampled actions"
    assert sampled[3:] != mode[3:], (mode, sampled)
    # The sampling noise is seeded too: the same command plays the same episodes.
    assert _eval(capsys, trained_run, "--episodes", "5", "--sample") == sampled


@pytest.mark.slow
def test_eval_observes_through_the_runs_observation_statistics(tmp_path, capsys):
    """A run trained with env.normalize_obs saw only normalized observations: eval must
    normalize with the statistics its checkpoint saved. Seed 1 and 96 updates of
    cartpole_ppo give a policy that held the pole for all 500 steps on an Intel CPU and 252
    steps on an AMD EPYC one (XLA's CPU code differs between them, and so does the training).
    For scale: uniformly random actions last ~22 steps on these env seeds, and this policy fed
    raw observations ~15; 150 tells the two apart on either machine."""
    proc = run_command(
        agentenv_command(
            "train",
            "cartpole_ppo",
            *settings(
                "env.normalize_obs=true",
                "run.seed=1",
                f"run.total_env_steps={96 * 256}",
                f"run.run_dir={tmp_path}",
                "run.name=normalized",
                "run.progress=false",
            ),
        ),
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    checkpoint, episodes, mode, mean, _, _ = _eval(capsys, tmp_path / "normalized")
    assert (checkpoint, episodes, mode) == (96, 10, "deterministic")
    assert mean >= 150.0


def test_show_config_prints_the_resolved_config_with_the_overrides(tmp_path, capsys):
    overrides = ["algorithm.learning_rate=3e-4", "env.global_num_envs=4", "run.seed=7"]
    assert main(["show-config", "cartpole_ppo", *settings(*overrides)]) == 0
    printed = capsys.readouterr().out
    expected = load_config("cartpole_ppo", overrides)
    assert yaml.safe_load(printed) == config_to_dict(expected)
    saved = tmp_path / "shown.yaml"
    saved.write_text(printed)
    assert load_config(saved) == expected
    assert (expected.algorithm.learning_rate, expected.env.global_num_envs) == (3e-4, 4)
    assert expected.run.seed == 7 and expected != load_config("cartpole_ppo")
    # No file: the built-in defaults.
    assert main(["show-config"]) == 0
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text(capsys.readouterr().out)
    assert load_config(defaults) == ExperimentConfig()


def test_show_config_refuses_a_misspelt_override(capsys):
    assert main(["show-config", "cartpole_ppo", "--set", "algorithm.learnin_rate=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'algorithm.learnin_rate' (did you mean 'learning_rate'?)" in err, err


def _schema_keys(cls: type, prefix: str) -> list[str]:
    """Every leaf field of a schema section, dotted; each variant of a union section."""
    keys = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        variants = typing.get_args(hints[field.name]) or (hints[field.name],)
        if all(dataclasses.is_dataclass(v) for v in variants):
            for variant in variants:
                keys += _schema_keys(variant, f"{prefix}{field.name}.")
        else:
            keys.append(f"{prefix}{field.name}")
    return keys


def test_config_reference_is_the_schemas(capsys):
    assert main(["config-reference"]) == 0
    printed = capsys.readouterr().out
    assert printed == config_reference() + "\n"
    rows = re.findall(r"^\| `([\w.]+)` \| `[^`]*` \| ", printed, re.MULTILINE)
    assert rows == _schema_keys(ExperimentConfig, ""), "one row per schema field, in order"
