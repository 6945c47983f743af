"""Sizes nothing else bounds: the memory a config asks one process to hold (`config.sizes`),
counted by hand, and the start-up refusal of one that cannot fit (one process, under
`mpiexec -n 3`, with `env.backend: jax`): exit 2 within seconds, one message, no run folder."""

from __future__ import annotations

import time
import uuid

import pytest

from agentenv_jax.config import ConfigError, load_config
from agentenv_jax.config.sizes import (
    ENV_OBJECT_BYTES,
    MemoryLimit,
    check_memory,
    estimate_memory,
    machine_memory,
)
from agentenv_jax.envs.spaces import EnvSpaces, TextSpec

from conftest import REPO, agentenv_command, mpi_launch, processes_with, run_command, settings

CARTPOLE = EnvSpaces((4,), "discrete", 2, (), None, None)  # float32 [4] obs, int32 action
PENDULUM = EnvSpaces((3,), "continuous", 1, (1,), (-2.0,), (2.0,))  # float32 [3], [1]
PIXELS = EnvSpaces((84, 84, 4), "discrete", 6, (), None, None, obs_dtype="uint8")
NAVIGATION = EnvSpaces((10,), "discrete", 5, (), None, None, agents=3)
TEXT = EnvSpaces(
    (48,),
    "discrete",
    16,
    (2,),
    None,
    None,
    obs_dtype="int32",
    text=TextSpec(
        vocab_size=16, context_length=48, response_length=2, pad_id=0, bos_id=1, eos_id=2
    ),
)


def _config(*overrides: str, experiment: str | None = None):
    return load_config(experiment, list(overrides))


def _bytes(demands) -> dict[str, int]:
    return {demand.what: demand.nbytes for demand in demands}


def test_an_on_policy_env_rank_holds_its_envs_and_one_segment():
    config = _config("env.global_num_envs=8", "algorithm.rollout_length=32")
    demands = estimate_memory(config, CARTPOLE, env_rank_envs=3)
    # obs 4 x 4 bytes, action 4, fixed 14: 34 bytes a transition
    assert _bytes(demands) == {"its envs": 3 * (512 + 16), "one segment": 32 * 3 * 34}
    assert [d.settings for d in demands] == [
        ("env.global_num_envs",),
        ("env.global_num_envs", "algorithm.rollout_length"),
    ]


def test_a_learner_holds_its_share_of_the_batch():
    config = _config(
        "env.global_num_envs=8",
        "algorithm.rollout_length=16",
        "topology.num_learner_ranks=2",
        "algorithm.name=impala",
    )
    assert _bytes(estimate_memory(config, CARTPOLE, learner=True)) == {
        "the learner's batch": 16 * 4 * 34  # T x 8 / 2 envs x 34 bytes
    }


def test_one_process_holds_both_roles():
    config = _config("env.global_num_envs=8", "algorithm.rollout_length=32")
    demands = estimate_memory(config, CARTPOLE, env_rank_envs=8, learner=True)
    assert _bytes(demands) == {
        "its envs": 8 * 528,
        "one segment": 32 * 8 * 34,
        "the learner's batch": 32 * 8 * 34,
    }


def test_sac_env_ranks_hold_their_share_of_the_replay_capacity():
    config = _config(
        "algorithm.name=sac",
        "env.id=Pendulum-v1",
        "env.global_num_envs=4",
        "algorithm.replay_capacity=1000",
        "algorithm.learning_starts=100",
        "algorithm.batch_size=256",
    )
    # obs and next obs 2 x 3 x 4 bytes, action 4, reward and discount 8: 36 bytes
    assert _bytes(estimate_memory(config, PENDULUM, env_rank_envs=1, learner=True)) == {
        "its envs": 1 * (512 + 12),
        "its replay partition": 250 * 36,
        "the learner's batch": 256 * 36,
    }


def test_images_native_envs_agents_and_text_count_what_they_move():
    native = _config("env.vectorization=native", "algorithm.rollout_length=2")
    pixels = 84 * 84 * 4  # uint8
    assert _bytes(estimate_memory(native, PIXELS, env_rank_envs=10)) == {
        "its envs": 10 * pixels,  # no env object: a native vector env is arrays
        "one segment": 2 * 10 * (pixels + 4 + 14),
    }
    config = _config("algorithm.rollout_length=5")
    assert _bytes(estimate_memory(config, NAVIGATION, env_rank_envs=2)) == {
        "its envs": 2 * (512 + 3 * 40),  # three agents' observations
        "one segment": 5 * 2 * 3 * (40 + 4 + 14),  # one column per agent
    }
    assert _bytes(estimate_memory(config, TEXT, learner=True)) == {
        "the learner's batch": 5 * 8 * (48 * 4 + 2 * 4 + 14)  # context and message, int32
    }


def test_the_jax_backend_holds_its_envs_in_the_learner():
    config = _config(
        "env.global_num_envs=16", "algorithm.rollout_length=8", experiment="cartpole_ppo_jax"
    )
    assert _bytes(estimate_memory(config, CARTPOLE, learner=True)) == {
        "the learner's batch": 8 * 16 * 34,
        "the JAX envs' state": 16 * 16,
    }


def test_without_the_spaces_the_least_any_env_has_is_counted():
    config = _config("env.global_num_envs=1000", "algorithm.rollout_length=10")
    # one uint8 observation entry, a 4-byte action, 14 fixed: 19 bytes a transition
    assert _bytes(estimate_memory(config, env_rank_envs=500, learner=True)) == {
        "its envs": 500 * (ENV_OBJECT_BYTES + 1),
        "one segment": 10 * 500 * 19,
        "the learner's batch": 10 * 1000 * 19,
    }
    sac = _config(
        "algorithm.name=sac",
        "env.global_num_envs=2",
        "algorithm.replay_capacity=100",
        "algorithm.learning_starts=10",
    )
    assert _bytes(estimate_memory(sac, env_rank_envs=1))["its replay partition"] == 50 * 20


def test_a_config_that_cannot_fit_is_one_error_naming_the_setting_the_value_and_the_bytes():
    config = _config("env.global_num_envs=1e9")
    limit = MemoryLimit(64 * 2**30, "physical memory")
    with pytest.raises(ConfigError) as raised:
        check_memory(config, env_rank_envs=500_000_000, limit=limit)
    message = str(raised.value)
    total = 500_000_000 * 513 + 32 * 500_000_000 * 19
    assert message.startswith("env.global_num_envs = 1000000000, algorithm.rollout_length = 32 ")
    assert f"this env rank would hold at least {total:,} bytes" in message
    assert "its envs 238.9 GiB (500,000,000 envs x 513 bytes)" in message
    assert f"more than the {64 * 2**30:,} bytes (64.0 GiB) this machine can hold" in message
    assert "(physical memory); lower env.global_num_envs or algorithm.rollout_length" in message
    sac = _config("algorithm.name=sac", "algorithm.replay_capacity=1e13")
    with pytest.raises(ConfigError, match=r"^algorithm.replay_capacity = 10000000000000 cannot"):
        check_memory(sac, env_rank_envs=8, learner=True, limit=limit)  # batch, envs: negligible


def test_large_runs_that_fit_are_not_refused():
    limit = MemoryLimit(64 * 2**30, "physical memory")
    big = _config("env.global_num_envs=65536", "algorithm.rollout_length=128")
    check_memory(big, CARTPOLE, env_rank_envs=65536, learner=True, limit=limit)  # ~0.6 GiB
    pixels = _config("env.global_num_envs=256", "algorithm.rollout_length=128")
    check_memory(pixels, PIXELS, env_rank_envs=256, learner=True, limit=limit)  # ~1.7 GiB
    # Two copies (segment, batch) of 16384 x 128 frames of 28 KB: ~110 GiB
    with pytest.raises(ConfigError, match="env.global_num_envs = 16384"):
        check_memory(
            _config("env.global_num_envs=16384", "algorithm.rollout_length=128"),
            PIXELS,
            env_rank_envs=16384,
            learner=True,
            limit=limit,
        )


def test_the_machine_limit_is_at_most_its_physical_memory():
    import os

    limit = machine_memory()
    assert limit is not None
    assert 0 < limit.nbytes <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_integer_settings_accept_whole_numbers_in_float_notation_only():
    # How 1e9 reaches an int field: YAML reads it as a number, accepted when it is whole.
    assert _config("env.global_num_envs=1e9").env.global_num_envs == 1_000_000_000
    with pytest.raises(ConfigError, match="env.global_num_envs = 2.5 is not allowed"):
        _config("env.global_num_envs=2.5")


def _refused_here(config, *roles: dict) -> None:
    """Skip on a machine that could hold what the test asks for (about a terabyte): refused
    when any of the processes `roles` stands for (`check_memory`'s arguments) is."""
    for role in roles:
        try:
            check_memory(config, **role)
        except ConfigError:
            return
    pytest.skip(f"this machine can hold {machine_memory()}: the request would fit")


def _train(launch: list[str], experiment: str, override: str, tmp_path):
    marker = f"run.name=sizes-{uuid.uuid4().hex[:12]}"
    started = time.monotonic()
    proc = run_command(
        [
            *launch,
            *agentenv_command(
                "train", experiment, *settings(override, f"run.run_dir={tmp_path}", marker)
            ),
        ],
        timeout=60,
        cwd=REPO,
    )
    return proc, time.monotonic() - started, marker.removeprefix("run.name=")


@pytest.mark.slow
@pytest.mark.parametrize(
    "experiment, override, env_rank_envs",
    [
        ("cartpole_ppo", "env.global_num_envs=1000000000", 1_000_000_000),
        ("cartpole_ppo", "algorithm.rollout_length=1000000000", 8),
        ("pendulum_sac", "algorithm.replay_capacity=10000000000000", 4),
        ("cartpole_ppo_jax", "env.global_num_envs=1000000000", None),
    ],
)
def test_a_config_that_cannot_fit_is_refused_at_start_up(
    tmp_path, experiment, override, env_rank_envs
):
    roles = {"learner": True} if env_rank_envs is None else {"env_rank_envs": env_rank_envs}
    _refused_here(load_config(experiment, [override]), roles | {"learner": True})
    proc, elapsed, name = _train([], experiment, override, tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert elapsed < 30
    setting, value = override.split("=")
    assert f"{setting} = {value}" in proc.stderr and "cannot fit in memory" in proc.stderr
    assert proc.stderr.count("agentenv: error:") == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / name).exists()


@pytest.mark.slow
def test_a_billion_envs_are_refused_on_every_rank(tmp_path):
    override = "env.global_num_envs=1000000000"
    _refused_here(
        load_config("cartpole_ppo", [override]), {"learner": True}, {"env_rank_envs": 500_000_000}
    )
    proc, elapsed, name = _train(mpi_launch(3), "cartpole_ppo", override, tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert elapsed < 30
    assert "env.global_num_envs = 1000000000" in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("agentenv: error:") == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / name).exists()
    time.sleep(0.5)
    assert processes_with(name) == []
