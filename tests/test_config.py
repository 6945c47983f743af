"""Config loading, overrides and validation errors."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import yaml

from agentenv_jax.config import ConfigError, ExperimentConfig, load_config, save_config
from agentenv_jax.config.reference import config_reference
from agentenv_jax.transport.topology import make_topology

from conftest import EXPERIMENTS


def test_defaults_validate_and_match_the_schema():
    config = load_config(None)
    assert config == ExperimentConfig()
    assert config.env.id == "CartPole-v1"


def test_overrides_parse_yaml_values():
    config = load_config(
        None,
        [
            "algorithm.learning_rate=3e-4",
            "network.actor_hidden=[32, 16]",
            "env.max_episode_steps=null",
            "run.total_env_steps=1e5",
            "env.kwargs.sutton_barto_reward=true",
        ],
    )
    assert config.algorithm.learning_rate == pytest.approx(3e-4)
    assert config.network.actor_hidden == (32, 16)
    assert config.env.max_episode_steps is None
    assert config.run.total_env_steps == 100_000
    assert config.env.kwargs == {"sutton_barto_reward": True}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm.gama=0.9"], r"unknown key 'algorithm.gama' \(did you mean 'gamma'\?\)"),
        (["algoritm.gamma=0.9"], r"unknown key 'algoritm' \(did you mean 'algorithm'\?\)"),
        (
            ["algorithm.gamma=1.5"],
            r"algorithm.gamma = 1.5 is not allowed: expected a number in \[0, 1\]",
        ),
        (
            ["algorithm.num_epochs=2.5"],
            r"algorithm.num_epochs = 2.5 is not allowed: expected an integer",
        ),
        (["algorithm.num_epochs=true"], r"algorithm.num_epochs = True .* expected an integer"),
        (["run.seed=abc"], r"run.seed = 'abc' is not allowed: expected an integer"),
        (
            ["env.vectorization=synk"],
            r"expected one of 'sync', 'async', 'native' \(did you mean 'sync'",
        ),
        (
            ["env.global_num_envs=0"],
            r"env.global_num_envs = 0 is not allowed: expected an integer >= 1",
        ),
        (["network.actor_hidden=[]"], r"network.actor_hidden = \(\) is not allowed"),
        (["network.actor_hidden=64"], r"network.actor_hidden = 64 is not allowed: expected a list"),
        (["algorithm.num_minibatches=3"], r"algorithm.num_minibatches = 3 .* divisor of .* 256"),
        (["topology.num_learner_ranks=0"], r"topology.num_learner_ranks = 0 is not allowed"),
        (["env=3"], r"env = 3 is not allowed: expected a mapping"),
        (
            ["algorithm.gamma.x=1"],
            r"algorithm.gamma = \{.x.: 1\} is not allowed: expected a number",
        ),
        (["no_equals_sign"], r"expected key.path=value"),
        (
            ["checkpoint.save_replay=true"],
            r"checkpoint.save_replay = True .* \(only 'sac' keeps a replay buffer\)",
        ),
        (["env.frame_stack=0"], r"env.frame_stack = 0 is not allowed: expected an integer >= 1"),
        (["network.torso=resnet"], r"network.torso = 'resnet' .* 'auto', 'mlp', 'nature_cnn'"),
        (
            ["algorithm={name: sac}", "network.torso=nature_cnn"],
            r"network.torso = 'nature_cnn' .* with algorithm.name = 'sac'",
        ),
    ],
)
def test_bad_overrides_name_field_value_and_allowed(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_bad_files(tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(missing)
    malformed = tmp_path / "bad.yaml"
    malformed.write_text("env:\n  id: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(malformed)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(scalar)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "env:\n  id: Pendulum-v1\nalgorithm:\n  gamma: 0.9\nenv:\n  global_num_envs: 4\n",
            r"dup.yaml', line 5: key 'env' is given twice in one mapping \(first on line 1\)",
        ),
        (
            "run:\n  seed: 1\n  total_env_steps: 10\n  seed: 2\n",
            r"dup.yaml', line 4: key 'seed' is given twice in one mapping \(first on line 2\)",
        ),
        ("", r"dup.yaml' is empty: expected a mapping of sections"),
        ("# only a comment\n\n", r"dup.yaml' is empty: expected a mapping of sections"),
    ],
    ids=["repeated_section", "repeated_key", "empty", "only_comments"],
)
def test_repeated_keys_and_empty_files_are_errors_naming_file_and_line(text, message, tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_repeated_key_in_an_override_value_is_an_error():
    with pytest.raises(ConfigError, match=r"override 'env.kwargs=\{a: 1, a: 2\}': .* key 'a' is"):
        load_config(None, ["env.kwargs={a: 1, a: 2}"])


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_experiment_file_loads_and_round_trips(path, tmp_path):
    config = load_config(path)
    saved = tmp_path / "config.yaml"
    save_config(config, saved)
    assert load_config(saved) == config
    assert isinstance(yaml.safe_load(saved.read_text()), dict)


def test_topology_splits_envs_and_rejects_impossible_worlds():
    config = load_config(None, ["env.global_num_envs=8"])
    topo = make_topology(config, world_size=4, rank=2)
    assert topo.num_env_ranks == 3 and topo.local_num_envs == (3, 3, 2)
    assert topo.env_offsets == (0, 3, 6) and topo.env_rank_index == 1
    single = make_topology(config, world_size=1, rank=0)
    assert single.is_learner and single.is_env_rank and single.local_num_envs == (8,)
    with pytest.raises(ConfigError, match="env.global_num_envs = 2 .* 3 env ranks"):
        make_topology(load_config(None, ["env.global_num_envs=2"]), world_size=4, rank=0)


def test_topology_with_two_learners_splits_envs_learner_major():
    config = load_config(None, ["env.global_num_envs=8", "topology.num_learner_ranks=2"])
    topo = make_topology(config, world_size=6, rank=3)
    # Env ranks 0 and 2 feed learner 0, 1 and 3 learner 1; learner 0 holds envs 0-3.
    assert topo.env_ranks_of(0) == [0, 2] and topo.env_ranks_of(1) == [1, 3]
    assert topo.learner_of(topo.env_rank_index) == 1
    assert topo.local_num_envs == (2, 2, 2, 2) and topo.env_offsets == (0, 4, 2, 6)
    assert topo.learner_major() == [0, 2, 1, 3]
    uneven = make_topology(config, world_size=5, rank=0)
    assert uneven.local_num_envs == (2, 4, 2) and uneven.env_offsets == (0, 4, 2)
    assert uneven.learner_index == 0 and uneven.multi_learner
    with pytest.raises(ConfigError, match="env.global_num_envs = 7 .* 2 learners"):
        make_topology(
            load_config(None, ["env.global_num_envs=7", "topology.num_learner_ranks=2"]), 5, 0
        )
    with pytest.raises(ConfigError, match="num_learner_ranks = 2 .* with 1 env rank"):
        make_topology(config, world_size=3, rank=0)


def test_config_reference_documents_every_field_of_every_section_and_algorithm():
    """Every field of every section, each algorithm's included, has a row whose meaning column
    (the last one, not the default) is filled from the schema's comment."""
    rows = {}
    for line in config_reference().splitlines():
        if line.startswith("| `"):
            key, default, meaning = (cell.strip() for cell in line.strip().strip("|").split("|"))
            rows.setdefault(key.strip("`"), []).append((default, meaning))
    hints = typing.get_type_hints(ExperimentConfig)
    expected = 0

    def check(cls: type, prefix: str) -> None:
        nonlocal expected
        for field in dataclasses.fields(cls):
            key = f"{prefix}.{field.name}"
            if field.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(
                nested := field.default_factory()
            ):  # a nested section (network.language_model): its fields have the rows
                check(type(nested), key)
                continue
            expected += 1
            assert key in rows, f"{key} has no row"
            assert all(meaning for _, meaning in rows[key]), f"{key} has no meaning"

    for section in dataclasses.fields(ExperimentConfig):
        for cls in typing.get_args(hints[section.name]) or (hints[section.name],):
            check(cls, section.name)
    assert "network.language_model.size" in rows
    assert sum(len(r) for r in rows.values()) == expected
