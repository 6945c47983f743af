"""What docs/ promises a run refuses, or guarantees, at start-up: IMPALA and SAC
on multi-agent envs, `eval --video` of a multi-agent run, `eval --split` of a task without
splits, `run.tensorboard` without
tensorboardX, a sweep without rliable; and that a separate value trunk gives the policy no
value gradient, and env ranks run XLA single-threaded (`topology.single_threaded_env_ranks`)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from agentenv_jax.algorithms.token_ppo import make_token_ppo_loss
from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import load_config
from agentenv_jax.envs.spaces import TextSpec
from agentenv_jax.learner.text_training import token_ppo_hyperparams
from agentenv_jax.networks.text_models import language_model_for
from agentenv_jax.runtime.launch import train
from agentenv_jax.workflow.cli import main
from agentenv_jax.workflow.evaluation import evaluate

from conftest import EXPERIMENTS, mpi_launch, read_events, run_command, settings

# `python -c` with an optional module made unimportable, as when its extra is not installed
# (None in sys.modules makes `import` raise ImportError), then the `agentenv` CLI.
_WITHOUT_MODULE = """
import sys
sys.modules[sys.argv[1]] = None
from agentenv_jax.workflow.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _agentenv_without(module: str, *args: str) -> list[str]:
    return [sys.executable, "-c", _WITHOUT_MODULE, module, *args]


@pytest.mark.parametrize("algorithm", ["impala", "sac"])
def test_impala_and_sac_refuse_a_multi_agent_env_at_start_up(tmp_path, capsys, algorithm):
    """docs/multi_agent.md: PPO only (IMPALA and SAC refuse multi-agent envs at start-up)."""
    code = main(
        [
            "train",
            "navigation_mappo",
            *settings(
                f"algorithm={{name: {algorithm}}}",
                "run.total_env_steps=1",  # were it not refused, one update
                f"run.run_dir={tmp_path}",
                "run.name=ma",
            ),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert (
        "agentenv: error: env.id = 'agentenv_jax/Navigation-v0' is a multi-agent env (3 agents): "
        f"algorithm.name = {algorithm!r} is not supported for it; use 'ppo'"
    ) in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "ma").exists(), "a refused run wrote its folder"


@pytest.mark.slow
def test_eval_video_of_a_multi_agent_run_is_refused(tmp_path, capsys):
    """docs/multi_agent.md (not yet): videos of multi-agent envs. One update of
    navigation_mappo is enough of a run to evaluate."""
    config = load_config(
        EXPERIMENTS / "navigation_mappo.yaml",
        [
            "run.total_env_steps=1",
            f"run.run_dir={tmp_path}",
            "run.name=ma",
            "run.progress=false",
        ],
    )
    run = train(config).run_dir
    clips = tmp_path / "clips"
    assert main(["eval", str(run), "--episodes", "1", "--video", str(clips)]) == 2
    err = capsys.readouterr().err
    assert (
        "agentenv: error: --video is not supported for multi-agent envs: evaluate without it"
    ) in err, err
    assert not clips.exists()
    with pytest.raises(ConfigError, match="--video is not supported for multi-agent envs"):
        evaluate(run, episodes=1, video_dir=clips)
    assert len(evaluate(run, episodes=1).returns) == 1  # the run itself evaluates


def test_eval_split_of_a_task_without_splits_is_refused_before_anything_loads(tmp_path):
    """Only text tasks with a held-out split (reasoning-gym's, dataset files', skyrl-gym's)
    take --split; the refusal comes before any checkpoint is read (this run folder has
    none)."""
    (tmp_path / "config.yaml").write_text((EXPERIMENTS / "arithmetic_ppo.yaml").read_text())
    with pytest.raises(ConfigError, match=r"--split is for text tasks with a held-out split"):
        evaluate(tmp_path, episodes=1, split="test")
    (tmp_path / "config.yaml").write_text(
        (EXPERIMENTS / "arithmetic_ppo.yaml")
        .read_text()
        .replace("agentenv_jax/Arithmetic-v0", "reasoning_gym/chain_sum")
    )
    with pytest.raises(ConfigError, match=r"--split = 'dev' is not allowed: expected one of"):
        evaluate(tmp_path, episodes=1, split="dev")


@pytest.mark.slow
def test_tensorboard_without_tensorboardx_does_not_start(tmp_path):
    """Docs: run.tensorboard needs tensorboardX; without it the run does not start and
    says so."""
    proc = run_command(
        _agentenv_without(
            "tensorboardX",
            "train",
            "cartpole_ppo",
            *settings(
                "run.tensorboard=true",
                "run.total_env_steps=256",  # were it not refused, one update
                f"run.run_dir={tmp_path}",
                "run.name=tb",
            ),
        ),
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        "agentenv: error: run.tensorboard = True is not allowed here: it needs tensorboardX "
        "(pip install 'agentenv_jax[tensorboard]'), or set run.tensorboard=false"
    ) in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "tb").exists(), "the run started"


@pytest.mark.slow
def test_a_sweep_without_rliable_does_not_start(tmp_path):
    """Docs: a sweep's config table needs rliable ([sweep]); without it the sweep does not
    start (no trial runs, no folder is claimed)."""
    sweep = tmp_path / "nostats.yaml"
    body = {
        "base": "cartpole_ppo",
        "run_dir": str(tmp_path / "runs"),
        "seeds": 2,
        "set": ["run.total_env_steps=256", "run.progress=false"],  # were it not refused
    }
    sweep.write_text(yaml.safe_dump(body))
    proc = run_command(_agentenv_without("rliable", "sweep", str(sweep)), timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "agentenv: error: a sweep's results table needs rliable (" in proc.stderr
    assert "pip install 'agentenv_jax[sweep]'" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs" / "nostats").exists(), "the sweep started"


# A small text policy: 2 rows of 6 context and 4 response tokens over a 20-token vocabulary.
_TEXT = TextSpec(vocab_size=20, context_length=6, response_length=4, pad_id=0, bos_id=1, eos_id=2)
_SMALL_MODEL = [
    "network.language_model.d_model=16",
    "network.language_model.num_layers=1",
    "network.language_model.num_heads=2",
    "network.language_model.mlp_dim=32",
]


def _value_loss_gradients(value_trunk: str) -> dict:
    """Gradients of token PPO's loss when only its value term can move it: every advantage 0
    (so the clipped surrogate is 0 for any ratio) and no entropy or KL term."""
    config = load_config(None, [*_SMALL_MODEL, f"network.language_model.value_trunk={value_trunk}"])
    lm = language_model_for(config.network.language_model, _TEXT)
    params = lm.init(jax.random.key(3))
    hp = dataclasses.replace(
        token_ppo_hyperparams(config.algorithm, _TEXT),
        ent_coef=0.0,
        kl_coef=0.0,
        vf_coef=1.0,
    )

    def score(params, context, response):
        return tuple(lm.score(params, context, response, _TEXT.pad_id, _TEXT.eos_id))

    rng = np.random.default_rng(11)
    context = rng.integers(3, 20, (2, 6)).astype(np.int32)
    context[1, :2] = _TEXT.pad_id  # left padding
    response = rng.integers(3, 20, (2, 4)).astype(np.int32)
    response[0, 2] = _TEXT.eos_id
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], np.float32)
    batch = {
        "obs": context,
        "action": response,
        "log_prob": np.zeros((2, 4), np.float32),
        "value": np.zeros((2, 4), np.float32),
        "ref_log_prob": np.zeros((2, 4), np.float32),
        "advantage": np.zeros((2, 4), np.float32),
        "return": rng.normal(3.0, 1.0, (2, 4)).astype(np.float32) * mask,
        "mask": mask,
    }
    loss_fn = make_token_ppo_loss(score, hp)
    grads, metrics = jax.grad(loss_fn, has_aux=True)(params, batch, jnp.float32(0.2))
    assert float(metrics["loss/value"]) > 1.0 and float(metrics["loss/policy"]) == 0.0
    return grads


def _largest(tree) -> float:
    return max(float(np.abs(np.asarray(leaf)).max()) for leaf in jax.tree.leaves(tree))


@pytest.mark.slow
def test_a_separate_value_trunk_gives_the_policy_no_value_gradient():
    """docs/text.md: `network.language_model.value_trunk: separate` puts the value head on a
    trunk of its own, so the policy gets no value gradient; `shared` trains the policy's trunk
    with the value loss too."""
    separate = _value_loss_gradients("separate")
    assert set(separate) == {"policy", "critic", "value_head"}
    for path, leaf in jax.tree_util.tree_leaves_with_path(separate["policy"]):
        assert not np.any(np.asarray(leaf)), f"policy{jax.tree_util.keystr(path)}"
    assert _largest(separate["critic"]) > 0 and _largest(separate["value_head"]) > 0

    shared = _value_loss_gradients("shared")
    assert set(shared) == {"policy", "value_head"}
    assert _largest(shared["policy"]) > 1e-4  # the value loss does reach a shared trunk


def xla_flags_cartpole(record: str) -> gym.Env:
    """CartPole that writes, in the process that makes it, that process's XLA_FLAGS and
    whether XLA's backend had started yet (XLA reads its flags once, when it starts), to
    RECORD/PID.json. Used through `env.id: test_refusals:xla_flags_cartpole`."""
    from jax._src import xla_bridge

    seen = {
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "backend_started": xla_bridge.backends_are_initialized(),
    }
    (Path(record) / f"{os.getpid()}.json").write_text(json.dumps(seen))
    return gym.make("CartPole-v1")


@pytest.mark.slow
@pytest.mark.parametrize("single_threaded", [True, False])
def test_env_ranks_run_xla_single_threaded(tmp_path, single_threaded):
    """Docs: env ranks run XLA single-threaded (`topology.single_threaded_env_ranks`). Under
    mpiexec -n 2 (a learner, an env rank) the env rank makes its envs with
    --xla_cpu_multi_thread_eigen=false in XLA_FLAGS before XLA starts; with the setting off,
    without it. The learner makes no env."""
    record = tmp_path / "record"
    record.mkdir()
    proc = run_command(
        [
            *mpi_launch(2),
            sys.executable,
            "-m",
            "agentenv_jax.workflow.cli",
            "train",
            "cartpole_ppo",
            *settings(
                "env.id=test_refusals:xla_flags_cartpole",
                f"env.kwargs={{record: {record}}}",
                "env.global_num_envs=1",
                "run.total_env_steps=32",
                "topology.env_rank_inference=jit",  # the env rank runs XLA, not numpy
                f"topology.single_threaded_env_ranks={str(single_threaded).lower()}",
                f"run.run_dir={tmp_path}",
                "run.name=threads",
                "run.progress=false",
            ),
        ],
        timeout=240,
        cwd=tmp_path,
        extra_env={"XLA_FLAGS": ""},  # nothing from this process's environment
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    start = next(e for e in read_events(tmp_path / "threads") if e["event"] == "start")
    env_rank_pid = start["processes"]["1"]["pid"]
    seen = {int(p.stem): json.loads(p.read_text()) for p in record.glob("*.json")}
    assert list(seen) == [env_rank_pid], (seen, start["processes"])
    flags = seen[env_rank_pid]["xla_flags"].split()
    assert ("--xla_cpu_multi_thread_eigen=false" in flags) == single_threaded, flags
    assert not seen[env_rank_pid]["backend_started"], "XLA started before its flags were set"
