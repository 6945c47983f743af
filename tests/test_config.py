"""Config loading, overrides and validation errors."""

from __future__ import annotations

import dataclasses
import os
import typing

import pytest
import yaml

from agentenv_jax.config import ConfigError, ExperimentConfig, load_config, loading, save_config
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
            r"expected one of 'sync', 'async', 'native', 'envpool', 'ale' \(did you mean 'sync'",
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


def test_env_ranks_feed_the_learners_by_host_when_there_are_several():
    config = load_config(None, ["env.global_num_envs=12", "topology.num_learner_ranks=2"])
    # Learners on two GPU hosts; env ranks on three CPU hosts, interleaved by rank as a
    # launcher that cycles over hosts places them.
    cpu = ["c1", "c2", "c3"] * 2
    topo = make_topology(config, 8, 0, ["g1", "g2", *cpu])
    assert topo.env_ranks_of(0) == [0, 1, 3] and topo.env_ranks_of(1) == [2, 4, 5]
    # Learner 0's run holds all of c1 and one of c2's two env ranks, learner 1's the rest.
    assert {cpu[i] for i in topo.env_ranks_of(0)} == {"c1", "c2"}
    assert {cpu[i] for i in topo.env_ranks_of(1)} == {"c2", "c3"}
    assert topo.local_num_envs == (2,) * 6 and topo.env_offsets == (0, 2, 6, 4, 8, 10)
    assert topo.learner_major() == [0, 1, 3, 2, 4, 5]
    assert [topo.learner_of_rank(r) for r in range(8)] == [0, 1, 0, 0, 1, 0, 1, 1]
    # Env ranks on a learner's own host feed it.
    local = make_topology(config, 6, 0, ["a", "b", "b", "a", "b", "a"])
    assert local.env_ranks_of(0) == [1, 3] and local.env_ranks_of(1) == [0, 2]
    # One host: round-robin, as without hosts.
    same = make_topology(config, 6, 0, ["a"] * 6)
    assert same.env_ranks_of(0) == [0, 2] and same.feeds == ()


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


def _alias_bomb(levels: int, indent: str = "") -> str:
    """A "billion laughs": anchor `a0` is nine strings and each `a{i}` nine aliases of the one
    before, so `a{levels - 1}` stands for 9**levels strings in a few lines."""
    lines = [f"{indent}a0: &a0 [{', '.join(['lol'] * 9)}]"]
    lines += [f"{indent}a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# The strict loader on libyaml, as used, and on the pure-Python parser, the fallback for a
# PyYAML built without libyaml: both must refuse what the other refuses.
STRICT_LOADERS = {"libyaml": loading._STRICT_LOADER, "pure": loading._PURE_STRICT_LOADER}


@pytest.fixture(params=list(STRICT_LOADERS))
def strict_loader(request, monkeypatch):
    monkeypatch.setattr(loading, "_STRICT_LOADER", STRICT_LOADERS[request.param])
    return request.param


def test_config_files_are_parsed_by_libyaml():
    assert yaml.__with_libyaml__, "PyYAML is built without libyaml: configs parse 5x slower"
    assert issubclass(loading._STRICT_LOADER, yaml.CSafeLoader)
    assert not issubclass(loading._PURE_STRICT_LOADER, yaml.CSafeLoader)


def test_an_alias_bomb_in_env_kwargs_is_refused_by_the_alias_bound(
    tmp_path, monkeypatch, strict_loader
):
    path = tmp_path / "bomb.yaml"
    path.write_text("env:\n  kwargs:\n" + _alias_bomb(6, indent="    "))
    # a0 is 10 nodes, a{i} 1 + 9 * a{i-1}'s: 672,614 in all with the 11 of the mappings and
    # keys, of which 26 are written; a4 (line 7) is the one whose repeats add the most.
    with pytest.raises(
        ConfigError,
        match=r"bomb.yaml', line 7: aliases of the node anchored there \(and of others\) stand "
        r"for 672,588 nodes; at most 10,000 are allowed",
    ):
        load_config(path)
    # The bound alone refuses it: above it the file loads, its aliases shared lists that are
    # expanded into 9**6 strings (a second; 9**9 take minutes and gigabytes) when copied.
    monkeypatch.setattr(loading, "_MAX_ALIAS_NODES", 10**9)
    kwargs = load_config(path).env.kwargs
    assert len(kwargs["a5"]) == 9 and kwargs["a5"][0] is kwargs["a4"]


@pytest.mark.parametrize(
    "text, message",
    [
        (_alias_bomb(9), r"line 8: aliases .* stand for 4\d\d,\d\d\d,\d\d\d nodes; at most"),
        (
            "env:\n  kwargs:\n    m0: &m0 {a: 1, b: 2}\n"
            + "".join(
                f"    m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 9)}]}}\n" for i in range(1, 7)
            ),
            r"line 8: aliases .* stand for [\d,]+ nodes; at most 10,000 are allowed",
        ),
        ("env:\n  kwargs:\n    a: &a [1, *a]\n", r"line 3: the node anchored there holds an alias"),
    ],
    ids=["at_the_top", "merge_keys", "recursive"],
)
def test_alias_bombs_and_recursive_aliases_are_refused(tmp_path, text, message, strict_loader):
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"config file '.*bomb.yaml', " + message):
        load_config(path)


def test_an_alias_bomb_in_an_override_is_refused(strict_loader):
    bomb = "{a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1], " + ", ".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 6)
    )
    with pytest.raises(ConfigError, match=r"override 'env.kwargs=\{a0: .*: line 1: aliases"):
        load_config(None, [f"env.kwargs={bomb}}}"])


def test_aliases_that_share_a_little_still_load(tmp_path, strict_loader):
    path = tmp_path / "shared.yaml"
    path.write_text(
        "env:\n  kwargs:\n    base: &base {size: 4, walls: [1, 2]}\n    copy: *base\n"
        "    merged: {<<: *base, speed: 2}\n"
        "network:\n  actor_hidden: &hidden [32, 32]\n  critic_hidden: *hidden\n"
    )
    config = load_config(path)
    assert config.env.kwargs["copy"] == {"size": 4, "walls": [1, 2]}
    assert config.env.kwargs["merged"] == {"size": 4, "walls": [1, 2], "speed": 2}
    assert config.network.critic_hidden == (32, 32)


def test_both_loaders_refuse_repeated_keys_and_read_deep_nesting(tmp_path, strict_loader):
    path = tmp_path / "dup.yaml"
    path.write_text("env:\n  kwargs:\n    a: {b: 1, b: 2}\n")
    with pytest.raises(ConfigError, match=r"dup.yaml', line 3: key 'b' is given twice"):
        load_config(path)
    path.write_text("env:\n  kwargs:\n    ? [a, b]\n    : 1\n")
    with pytest.raises(ConfigError, match=r"dup.yaml' is not valid YAML: (?s:.*)unhashable key"):
        load_config(path)
    # Nested lists are built without recursion (as PyYAML's own constructors do), so deep
    # nesting is read, not a RecursionError; libyaml refuses more than 1000 levels itself.
    depth = 900 if strict_loader == "libyaml" else 150
    path.write_text(f"env:\n  kwargs:\n    a: {'[' * depth}{']' * depth}\n")
    nested = load_config(path).env.kwargs["a"]
    for _ in range(depth - 1):
        (nested,) = nested
    assert nested == []


@pytest.mark.timeout(30, method="signal")  # blocking on the FIFO fails the test, not the run
@pytest.mark.parametrize("kind", ["FIFO", "directory", "character device"])
def test_a_config_path_that_is_not_a_regular_file_is_named_for_what_it_is(tmp_path, kind):
    if kind == "FIFO":
        path = tmp_path / "pipe.yaml"
        os.mkfifo(path)  # nothing writes to it: reading it would wait for ever
    else:
        path = tmp_path if kind == "directory" else "/dev/null"
    with pytest.raises(ConfigError, match=rf"config file '{path}' is a {kind}, not a regular"):
        load_config(path)


def test_a_config_file_over_the_size_limit_is_refused_before_parsing(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("run:\n  seed: 1\n" + "#" * loading._MAX_FILE_BYTES)
    with pytest.raises(
        ConfigError,
        match=r"huge.yaml' is 2,097,167 bytes; at most 2,097,152 \(2 MiB\) are allowed",
    ):
        load_config(path)
    path.write_text("run:\n  seed: 1\n" + "#" * (loading._MAX_FILE_BYTES - 100))
    assert load_config(path).run.seed == 1
