"""The shipped experiments: found by name from any folder, listed, inside the wheel, and each
one trained for a tiny budget and evaluated (a module of its own, so that pytest-xdist runs
these beside test_training.py's learning runs rather than after them)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zipfile

import gymnasium as gym
import pytest

from agentenv_jax.config import ConfigError, load_config
from agentenv_jax.envs.multi_agent.registry import is_multi_agent, make_multi_agent_env
from agentenv_jax.envs.text.registry import is_text_env, make_text_vector_env, text_env_seats
from agentenv_jax.metrics.logger import read_metrics
from agentenv_jax.runtime.launch import train
from agentenv_jax.workflow.evaluation import evaluate

from conftest import EXPERIMENTS, REPO, agentenv_command, run_command, settings
from test_training import assert_reconciles


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


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_experiment_runs_with_a_tiny_budget(path, run_dir):
    overrides = [f"run.run_dir={run_dir}", "run.name=smoke", "run.progress=false"]
    if load_config(path).algorithm.name == "sac":
        overrides += [
            "algorithm.learning_starts=64",
            "run.total_env_steps=80",
            "algorithm.log_interval=1",
        ]
    else:
        overrides += ["run.total_env_steps=1"]
    if load_config(path).env.preset == "atari":
        # The evaluation's games end at 100 agent steps (an untrained policy rarely loses five
        # lives of Breakout sooner, and may play until the 108 K-frame limit).
        overrides += ["env.max_episode_steps=100"]
    if load_config(path).network.language_model.pretrained is not None:
        # A pretrained model (135 M parameters) trains on one group of answers (two at least):
        # loading, compiling and stepping it is the check, not the size of its batch.
        shipped = load_config(path)
        seats = text_env_seats(shipped.env.id)  # a game of two seats is two envs
        overrides += [
            f"env.global_num_envs={2 * seats}",
            "algorithm.rollout_length=1",
            "algorithm.num_minibatches=1",
        ]
        if getattr(shipped.algorithm, "advantage", "gae") != "gae":
            overrides += ["algorithm.group_size=2"]
        if shipped.env.kwargs.get("max_turns", 1) > 1:
            # A multi-turn task's group baseline takes whole rounds of episodes: two messages.
            overrides += ["env.kwargs.max_turns=2", "algorithm.rollout_length=2"]
    if load_config(path).env.id == "agentenv_jax/Dataset-v0":
        # Its data files are written by a script of the repository, as the experiment says.
        subprocess.run(
            [sys.executable, str(REPO / "tools" / "gsm_symbolic_jsonl.py"), "--rows", "200"]
            + ["--out", str(run_dir / "data")],
            check=True,
            capture_output=True,
            timeout=120,
        )
        overrides += [
            f"env.kwargs.path={run_dir / 'data' / 'train.jsonl'}",
            f"env.kwargs.test_path={run_dir / 'data' / 'test.jsonl'}",
        ]
    config = load_config(path, overrides)
    result = train(config)
    assert result.updates >= 1
    assert_reconciles(result.accounting, synchronous=config.algorithm.name == "ppo")
    record = read_metrics(result.run_dir / "metrics.jsonl")[0]
    losses = [v for k, v in record.items() if k.startswith("loss/")]
    assert losses and all(math.isfinite(v) for v in losses)
    # Its final checkpoint plays: the episodes end where the env's time limit says, at most.
    evaluation = evaluate(result.run_dir, episodes=2)
    assert evaluation.checkpoint == result.updates and len(evaluation.returns) == 2
    if is_multi_agent(config.env.id):  # lengths in env steps, up to the env's horizon
        env = make_multi_agent_env(config.env.id, 1, config.env.kwargs, None)
        limit = env.max_episode_steps
        env.close()
    elif is_text_env(config.env.id):  # lengths in messages, up to the task's turns
        seats = text_env_seats(config.env.id)
        limit = make_text_vector_env(config.env.id, seats, config.env.kwargs).max_turns
    elif config.env.preset == "atari":  # whole games, cut at the frame limit
        limit = config.env.max_episode_steps
    else:
        limit = gym.spec(config.env.id).max_episode_steps or math.inf  # Catch: when a ball lands
    # (A seat of a game may lose it before its first move, the opponent's seat moving first.)
    shortest = 0 if is_text_env(config.env.id) and text_env_seats(config.env.id) > 1 else 1
    assert all(shortest <= n <= limit for n in evaluation.lengths)
    assert all(math.isfinite(r) for r in evaluation.returns)
    if config.env.id == "CartPole-v1":  # one update: far from holding the pole up
        assert evaluation.mean < 200
