"""The smoke run of a shipped experiment, which tests/test_experiments*.py share: trained for a
tiny budget, reconciled and evaluated. Its experiments are split over four modules (the
pretrained language models on single-turn and on multi-turn tasks, Atari, the rest), so that
pytest-xdist's workers, which take whole modules, run them side by side."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import gymnasium as gym

from agentenv_jax.config import load_config
from agentenv_jax.envs.multi_agent.registry import is_multi_agent, make_multi_agent_env
from agentenv_jax.envs.text.registry import is_text_env, make_text_vector_env, text_env_seats
from agentenv_jax.metrics.logger import read_metrics
from agentenv_jax.runtime.launch import train
from agentenv_jax.workflow.evaluation import Evaluation, evaluate

from conftest import EXPERIMENTS, REPO
from test_training import assert_reconciles

# Shipped experiments that a learning test trains as shipped and evaluates with
# `assert_final_checkpoint_plays`: a smoke run would only repeat their start-up (~50-70 s of
# SmolLM2 in .ci/run). Each test names the file.
TRAINED_AS_SHIPPED = {
    "arithmetic_smollm2.yaml": "tests/test_smollm2_grpo.py",
    "openenv_sums_smollm2.yaml": "tests/test_smollm2_openenv.py",  # its learning rate raised
}


def turns_setting(config) -> str:
    """The env.kwargs entry that bounds a text env's messages per episode: an agent env's
    model calls per run, a task's turns."""
    return "max_calls" if config.env.id == "agent" else "max_turns"


def experiments(kind: str) -> list[Path]:
    """The shipped experiment files of `kind`: "pretrained" (a pretrained language model on a
    single-turn task), "pretrained_multi_turn" (on a multi-turn one: a module of its own, as
    each set takes minutes), "atari" (the Atari preset) or "other"."""

    def kind_of(path: Path) -> str:
        config = load_config(path)
        if config.network.language_model.pretrained is not None:
            multi_turn = config.env.kwargs.get(turns_setting(config), 1) > 1
            return "pretrained_multi_turn" if multi_turn else "pretrained"
        return "atari" if config.env.preset == "atari" else "other"

    return [
        path
        for path in sorted(EXPERIMENTS.glob("*.yaml"))
        if kind_of(path) == kind and path.name not in TRAINED_AS_SHIPPED
    ]


def run_smoke(path: Path, run_dir: Path) -> None:
    """Train the experiment at `path` for a tiny budget in `run_dir`, check its accounting and
    losses, and evaluate its final checkpoint."""
    shipped = load_config(path)
    seats = text_env_seats(shipped.env.id) if is_text_env(shipped.env.id) else 1
    overrides = [f"run.run_dir={run_dir}", "run.name=smoke", "run.progress=false"]
    if shipped.algorithm.name == "sac":
        overrides += [
            "algorithm.learning_starts=64",
            "run.total_env_steps=80",
            "algorithm.log_interval=1",
        ]
    else:
        overrides += ["run.total_env_steps=1"]
    if shipped.env.preset == "atari":
        # The evaluation's games end at 100 agent steps (an untrained policy rarely loses five
        # lives of Breakout sooner, and may play until the 108 K-frame limit).
        # One update of 16-step rollouts: the file's CNN, envs and losses compiled and run,
        # without a full rollout of frames to step and train on.
        overrides += ["env.max_episode_steps=100", "algorithm.rollout_length=16"]
    if shipped.network.language_model.pretrained is not None:
        # A pretrained model (135 M parameters) trains on one group of answers (two at least;
        # a game of two seats is two envs): loading, compiling and stepping it is the check,
        # not the size of its batch.
        overrides += [
            f"env.global_num_envs={2 * seats}",
            "algorithm.rollout_length=1",
            "algorithm.num_minibatches=1",
        ]
        if getattr(shipped.algorithm, "advantage", "gae") != "gae":
            overrides += ["algorithm.group_size=2"]
        if shipped.env.kwargs.get(turns_setting(shipped), 1) > 1:
            # A multi-turn task's group baseline takes whole rounds of episodes: two messages.
            overrides += [f"env.kwargs.{turns_setting(shipped)}=2", "algorithm.rollout_length=2"]
    if shipped.env.id == "agentenv_jax/Dataset-v0":
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
    if is_text_env(shipped.env.id):  # what of generation and of the update was padding
        assert 0.0 < record["generation_utilisation"] <= 1.0
        assert 0.0 <= record["update_padding_fraction"] < 1.0
    assert_final_checkpoint_plays(result.run_dir, result.updates)


def assert_final_checkpoint_plays(
    run_dir: Path, updates: int, episodes: int = 2, deterministic: bool = True
) -> Evaluation:
    """The final checkpoint (of `updates`) of the run in `run_dir` plays `episodes` episodes
    (`agentenv eval`, `--sample` unless `deterministic`), which end where the env's time limit
    says, at most; their evaluation."""
    config = load_config(run_dir / "config.yaml")
    seats = text_env_seats(config.env.id) if is_text_env(config.env.id) else 1
    evaluation = evaluate(run_dir, episodes=episodes, deterministic=deterministic)
    assert evaluation.checkpoint == updates and len(evaluation.returns) == episodes
    if is_multi_agent(config.env.id):  # lengths in env steps, up to the env's horizon
        env = make_multi_agent_env(config.env.id, 1, config.env.kwargs, None)
        limit = env.max_episode_steps
        env.close()
    elif config.env.id == "agent":  # lengths in model calls, up to a run's
        limit = config.env.kwargs["max_calls"]
    elif is_text_env(config.env.id):  # lengths in messages, up to the task's turns
        limit = make_text_vector_env(config.env.id, seats, config.env.kwargs).max_turns
    elif config.env.preset == "atari":  # whole games, cut at the frame limit
        limit = config.env.max_episode_steps
    else:
        limit = gym.spec(config.env.id).max_episode_steps or math.inf  # Catch: when a ball lands
    # (A seat of a game may lose it before its first move, the opponent's seat moving first.)
    shortest = 0 if seats > 1 else 1
    assert all(shortest <= n <= limit for n in evaluation.lengths)
    assert all(math.isfinite(r) for r in evaluation.returns)
    if config.env.id == "CartPole-v1":  # one update: far from holding the pole up
        assert evaluation.mean < 200
    return evaluation
