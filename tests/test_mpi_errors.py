"""Bad input under `mpiexec -n 3` (a table of cases): non-zero exit within 30 s, one clear
message naming the problem, no process left behind."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from conftest import (
    EXPERIMENTS,
    REPO,
    agentenv_command,
    mpi_launch,
    mpiexec_path,
    processes_with,
    run_command,
    settings,
)

pytestmark = pytest.mark.slow  # every test here starts a process or trains

CARTPOLE = str(EXPERIMENTS / "cartpole_ppo.yaml")

BAD_INPUTS = {
    "unknown_key": (
        ["--set", "algorithm.gama=0.9"],
        "unknown key 'algorithm.gama' (did you mean 'gamma'?)",
    ),
    "bad_value": (
        ["--set", "algorithm.gamma=1.5"],
        "algorithm.gamma = 1.5 is not allowed: expected a number in [0, 1]",
    ),
    "wrong_type": (
        ["--set", "run.total_env_steps=lots"],
        "run.total_env_steps = 'lots' is not allowed: expected an integer",
    ),
    "unknown_env_id": (
        ["--set", "env.id=CartPol-v1"],
        "env.id = 'CartPol-v1' is not a registered Gymnasium environment "
        "(did you mean 'CartPole-v1'?)",
    ),
    "env_factory_raises": (
        ["--set", "env.id=envs_for_tests:broken_env"],
        "RuntimeError: simulator asset 'robot.xml' not found",
    ),
    "env_kwargs_fail_at_first_reset": (
        ["--set", "env.id=envs_for_tests:scene_cartpole", "--set", "env.kwargs={scene: mars}"],
        "env.id = 'envs_for_tests:scene_cartpole' with env.kwargs = {'scene': 'mars'}: the env "
        "failed on its first reset: ValueError: scene 'mars' not found",
    ),
    "factory_returns_no_env": (
        ["--set", "env.id=envs_for_tests:not_an_env"],
        "env.id = 'envs_for_tests:not_an_env': the factory returned str, expected a gymnasium.Env",
    ),
    "unsupported_space": (
        ["--set", "env.id=envs_for_tests:text_observation_env"],
        "env.id = 'envs_for_tests:text_observation_env' has observation space Text(1, 8, charset=",
    ),
    "cnn_torso_without_images": (
        ["--set", "network.torso=nature_cnn"],
        "network.torso = 'nature_cnn' needs image observations",
    ),
    "normalized_images": (
        ["--set", "env.id=agentenv_jax/Catch-v0", "--set", "env.normalize_obs=true"],
        "env.normalize_obs = true is not allowed for images",
    ),
    "too_many_devices": (
        ["--set", "topology.learner_devices=64"],
        "topology.learner_devices = 64 is not allowed",
    ),
    "more_learner_ranks_than_the_world": (
        ["--set", "topology.num_learner_ranks=3"],
        "topology.num_learner_ranks = 3 leaves no env rank in a world of 3 processes",
    ),
    "a_learner_without_env_ranks": (
        ["--set", "topology.num_learner_ranks=2"],
        "topology.num_learner_ranks = 2 is not allowed with 1 env rank(s) in a world of 3",
    ),
    "fewer_envs_than_env_ranks": (
        ["--set", "env.global_num_envs=1"],
        "env.global_num_envs = 1 is not allowed with 2 env ranks",
    ),
    "unknown_algorithm": (
        ["--set", "algorithm.name=dqn"],
        "algorithm.name = 'dqn' is not allowed: expected one of 'ppo', 'impala', 'sac'",
    ),
    "sac_on_discrete_actions": (
        ["--set", "algorithm={name: sac}"],
        "algorithm.name = 'sac' needs a Box action space",
    ),
    "bad_literal": (
        ["--set", "network.activation=swish"],
        "network.activation = 'swish' is not allowed: expected one of 'tanh', 'relu', 'gelu'",
    ),
    "override_without_equals": (
        ["--set", "run.seed"],
        "override 'run.seed' is not allowed: expected key.path=value",
    ),
    "native_needs_registered_id": (
        ["--set", "env.id=envs_for_tests:cartpole", "--set", "env.vectorization=native"],
        "env.vectorization = 'native' needs a registered Gymnasium id",
    ),
    "unknown_atari_game": (
        ["--set", "env={id: ALE/Pongg-v5, preset: atari, vectorization: envpool}"],
        "env.id = 'ALE/Pongg-v5' is not an Atari game (did you mean 'Pong', ROM 'pong'?)",
    ),
    "atari_groups_beyond_an_env_ranks_games": (
        [
            "--set",
            "env={id: ALE/Pong-v5, preset: atari, vectorization: ale, global_num_envs: 4}",
            "--set",
            "env.num_splits=3",
        ],
        "env.num_splits = 3 is not allowed: expected 1 to the 2 envs of this env rank",
    ),
    "negative_learning_rate": (
        ["--set", "algorithm.learning_rate=-1"],
        "algorithm.learning_rate = -1.0 is not allowed: expected a number > 0",
    ),
    "zero_episode_length": (
        ["--set", "env.max_episode_steps=0"],
        "env.max_episode_steps = 0 is not allowed: expected null or an integer >= 1",
    ),
    "malformed_yaml_file": (
        ["@env:\n  id: [CartPole-v1\n"],
        "is not valid YAML",
    ),
    "yaml_file_not_a_mapping": (
        ["@- just\n- a list\n"],
        "must hold a mapping, not list",
    ),
    "repeated_section_in_file": (
        ["@env:\n  id: CartPole-v1\nenv:\n  global_num_envs: 4\n"],
        "line 3: key 'env' is given twice in one mapping (first on line 1)",
    ),
    "empty_file": (["@"], "is empty: expected a mapping of sections"),
    "resume_without_checkpoints": (
        ["--resume", "{tmp}"],
        "not a run directory with checkpoints",
    ),
}


def _arguments(overrides: list[str], tmp_path: Path) -> list[str]:
    """`@TEXT` stands for a config file holding TEXT; `{tmp}` for a fresh empty folder (a
    resume takes no config file)."""
    if overrides and overrides[0].startswith("@"):
        path = tmp_path / "experiment.yaml"
        path.write_text(overrides[0][1:].replace("\\n", "\n"))
        return [str(path)]
    config = [] if "--resume" in overrides else [CARTPOLE]
    return [*config, *(o.replace("{tmp}", str(tmp_path)) for o in overrides)]


# The bad inputs CI also tries under Open MPI's mpirun: one of each kind (a config key, a value,
# a file, a start-up check), not the whole list again.
OPEN_MPI_BAD_INPUTS = ("unknown_key", "bad_value", "malformed_yaml_file", "too_many_devices")


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.openmpi) if name in OPEN_MPI_BAD_INPUTS else name
        for name in sorted(BAD_INPUTS)
    ],
)
def test_bad_input_fails_fast_on_every_rank(name, tmp_path):
    overrides, message = BAD_INPUTS[name]
    marker = f"run.name=bad-{uuid.uuid4().hex[:12]}"
    started = time.monotonic()
    proc = run_command(
        [
            *mpi_launch(3),
            *agentenv_command(
                "train",
                *_arguments(overrides, tmp_path),
                "--set",
                f"run.run_dir={tmp_path}",
                "--set",
                marker,
            ),
        ],
        timeout=30,
        cwd=REPO,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode != 0
    assert elapsed < 30
    assert message in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("agentenv: error:") == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "pending" not in proc.stderr  # MPICH's note on requests never completed or freed
    assert not (tmp_path / marker.removeprefix("run.name=")).exists()  # no run folder
    time.sleep(0.5)
    assert processes_with(marker) == []


def test_missing_config_file_is_one_clear_error(tmp_path):
    proc = run_command(
        [mpiexec_path(), "-n", "3", *agentenv_command("train", str(tmp_path / "nope.yaml"))],
        timeout=30,
        cwd=REPO,
    )
    assert proc.returncode != 0
    assert proc.stderr.count("agentenv: error:") == 1
    assert "does not exist" in proc.stderr


def test_env_crash_mid_run_stops_the_whole_job(tmp_path):
    """With `env.on_fault: fail`, an env error on one env rank aborts every rank, with that
    rank's traceback."""
    marker = f"run.name=crash-{uuid.uuid4().hex[:12]}"
    proc = run_command(
        [
            mpiexec_path(),
            "-n",
            "3",
            *agentenv_command(
                "train",
                CARTPOLE,
                "--set",
                "env.id=envs_for_tests:crashing_cartpole",
                "--set",
                "env.on_fault=fail",
                "--set",
                f"run.run_dir={tmp_path}",
                "--set",
                marker,
            ),
        ],
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode != 0
    assert "RuntimeError: simulator diverged" in proc.stderr
    assert "[rank 1]" in proc.stderr or "[rank 2]" in proc.stderr
    time.sleep(0.5)
    assert processes_with(marker) == []


def test_env_kwargs_that_fail_at_first_reset_are_one_error_in_one_process(tmp_path):
    """Without a launcher too: one line naming env.kwargs, exit 2, no traceback, no run folder."""
    proc = run_command(
        agentenv_command(
            "train",
            CARTPOLE,
            "--set",
            "env.id=envs_for_tests:scene_cartpole",
            "--set",
            "env.kwargs={scene: mars}",
            "--set",
            f"run.run_dir={tmp_path}",
        ),
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("agentenv: error:") == 1 and "Traceback" not in proc.stderr
    assert "with env.kwargs = {'scene': 'mars'}: the env failed on its first reset" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "choice, launcher_variables",
    [("mpi", {}), ("inprocess", {"PMI_RANK": "0", "PMI_SIZE": "1"})],
    ids=["mpi_without_launcher", "inprocess_despite_launcher_variables"],
)
def test_agentenv_transport_overrides_launcher_detection(choice, launcher_variables, tmp_path):
    """`AGENTENV_TRANSPORT=mpi` runs an MPI job of one rank where no launcher is detected;
    `inprocess` runs in one process although a launcher's variables are inherited (with them
    and no launcher behind them, MPI could not start)."""
    proc = run_command(
        agentenv_command(
            "train",
            CARTPOLE,
            *settings(f"run.run_dir={tmp_path}", "run.name=t", "run.total_env_steps=512"),
        ),
        timeout=120,
        cwd=REPO,
        extra_env={"AGENTENV_TRANSPORT": choice, **launcher_variables},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert summary["accounting"]["reconciles"] and summary["env_steps"] == 512


def test_unknown_agentenv_transport_is_one_clear_error(tmp_path):
    proc = run_command(
        agentenv_command("train", CARTPOLE, *settings(f"run.run_dir={tmp_path}")),
        timeout=60,
        cwd=REPO,
        extra_env={"AGENTENV_TRANSPORT": "tcp"},
    )
    assert proc.returncode == 2 and proc.stderr.count("agentenv: error:") == 1
    assert "AGENTENV_TRANSPORT = 'tcp' is not allowed: expected 'mpi' or 'inprocess'" in proc.stderr
    assert list(tmp_path.iterdir()) == []
