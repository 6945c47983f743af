"""Multi-agent training: agent columns, centralised and independent critics, death masking, the
team and per-agent returns; MAPPO on the built-in navigation task and on PettingZoo's MPE, IPPO,
and per-group policies (predator-prey, speaker-listener) beating random play."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentenv_jax.algorithms.ppo import PPOHyperparams, make_ppo_loss
from agentenv_jax.config import ExperimentConfig, load_config
from agentenv_jax.envs.factory import EVAL_SEED_BASE, make_vector_env, vector_env_spaces
from agentenv_jax.envs.multi_agent.columns import ACTED, AgentColumns
from agentenv_jax.envs.multi_agent.navigation import NavigationVectorEnv
from agentenv_jax.envs.multi_agent.predator_prey import PredatorPreyVectorEnv
from agentenv_jax.metrics.episode_window import EpisodeWindow
from agentenv_jax.networks import (
    action_distribution,
    actor_critic_for,
    init_params,
    make_actor_critic,
)
from agentenv_jax.runtime.launch import train

from conftest import EXPERIMENTS, REPO, agentenv_command, mpiexec_path, run_command, settings

# Cooperative navigation (3 agents, 25 steps, MPE's rewards): uniformly random actions score a
# mean team return of -83.3 (sum over agents; 200 episodes, per-episode std 22.8; doing nothing
# scores -77.2). Over navigation_mappo's window of 100 episodes per agent, its untrained policy
# ends at -75 to -85 (learning rate 1e-9; -80.6 under `mpiexec -n 3`) and MAPPO as shipped (480k
# agent steps) at -55 to -60 over seeds 0-1 in one process, -58.0 under `mpiexec -n 3`.
RANDOM_TEAM_RETURN = -83.3
TRAINED_TEAM_RETURN = -67.0

# Short learning runs: 16 envs, a constant learning rate, the shipped experiments otherwise, with
# the window of 100 episodes per agent as the score. Random play below is `_group_returns(config,
# None, num_envs=64, episodes=8)` (512 episodes of uniformly random actions on the evaluation
# seeds); the untrained policy is the same run at `algorithm.learning_rate=1e-9`.
# Two-agent cooperative navigation (MPE2's simple_spread_v3 with N = 2, or Navigation-v0 with
# num_agents 2, which plays it step for step): random play scores a team return of -42.2
# (-42.9 and -40.0 over 200 and 128 other episodes). In 32k agent steps (20 updates) MAPPO ends
# at -32.3 on simple_spread (seed 0) and -32.0 to -32.2 on Navigation-v0 (seeds 0-2), IPPO at
# -31.9 to -33.0 on Navigation-v0 (seeds 0-2); their untrained policies at -42.5 and -42.6.
RANDOM_TWO_AGENT_RETURN = -42.2
TRAINED_TWO_AGENT_RETURN = -37.0
# Predator-prey, one policy per team, 48k agent steps (15 updates), scored per team by
# `_group_returns` (128 episodes of the trained policies). Random play: predators 7.9, prey
# -85.4 (6.4 and -77.4 over the 128 episodes); the untrained policies: 9.7 and -74.8. Trained
# (seeds 0-2): prey -16.7 to -19.2 (they keep to the arena and away from predators); predators
# 25.3 to 30.2, where random predators score 12.0 to 13.6 against the same trained prey (a
# catch pays each predator +10).
RANDOM_PREY_RETURN, TRAINED_PREY_RETURN = -85.4, -50.0
RANDOM_PREDATOR_RETURN, TRAINED_PREDATOR_RETURN = 7.9, 18.0
# MPE2's speaker-listener, one policy per agent, 32k agent steps (20 updates): random play
# scores a team return of -83.2 (each agent gets the shared reward, -41.6), the untrained
# policies -84.8, the trained ones -38.9 to -41.3 (seed 0, two runs). The listener learns to
# head for the landmarks without the speaker's help: with the speaker acting at random the
# trained listener still scores -22.0 per agent (-21.6 with the trained speaker), while the
# trained speaker with a random listener scores -43.2, random play's; its messages need a
# longer run.
RANDOM_SPEAKER_LISTENER_RETURN, TRAINED_SPEAKER_LISTENER_RETURN = -83.2, -60.0


def _short_run(experiment: str, run_dir, name: str, *overrides: str) -> tuple:
    """`experiment` trained in one process on 16 envs with a constant learning rate (and
    `overrides`): its config and `train`'s result."""
    config = load_config(
        EXPERIMENTS / f"{experiment}.yaml",
        [
            f"run.run_dir={run_dir}",
            f"run.name={name}",
            "run.progress=false",
            "env.global_num_envs=16",
            "algorithm.lr_schedule=constant",
            *overrides,
        ],
    )
    return config, train(config)


def _group_returns(
    config: ExperimentConfig,
    params: object,
    acting: tuple[str, ...] | None = None,
    num_envs: int = 32,
    episodes: int = 4,
) -> dict[str, float]:
    """Each agent group's return (the sum over its agents of their mean episode return) over
    the first `episodes` episodes of `num_envs` envs reset on the evaluation seeds. The groups
    in `acting` (all when None) sample from the policy of `params`; the others, or all when
    `params` is None, take uniformly random actions among their own."""
    env = make_vector_env(config.env, num_envs, config.network.critic)
    try:
        spaces = vector_env_spaces(config.env.id, env)
        n = env.agents_per_env
        counts = np.tile(env.action_counts or (spaces.action_size,) * n, num_envs)
        groups = np.tile(env.agent_groups, num_envs)
        rng = np.random.default_rng(0)
        if params is None:
            from_policy = np.zeros(env.num_envs, bool)
        else:
            names = env.group_names if acting is None else acting
            from_policy = np.isin(groups, [env.group_names.index(name) for name in names])
            _, apply_fn = actor_critic_for(config.network, spaces)
            distribution = action_distribution(spaces.action_kind)
            sample = jax.jit(
                lambda obs, noise: distribution.sample(apply_fn(params, obs)[0], noise)
            )
        obs, _ = env.reset(seed=EVAL_SEED_BASE)
        running = np.zeros(env.num_envs)
        finished: list[list[float]] = [[] for _ in range(env.num_envs)]
        while min(map(len, finished)) < episodes:
            action = np.floor(rng.random(env.num_envs) * counts).astype(np.int64)
            if from_policy.any():
                noise = rng.gumbel(size=(env.num_envs, spaces.action_size)).astype(np.float32)
                action = np.where(from_policy, np.asarray(sample(obs, noise)), action)
            obs, reward, terminated, truncated, _ = env.step(action)
            running += reward
            for column in np.flatnonzero(terminated | truncated):  # that agent's episode ended
                finished[column].append(running[column])
                running[column] = 0.0
    finally:
        env.close()
    per_agent = np.array([f[:episodes] for f in finished]).mean(axis=1).reshape(num_envs, n)
    agent_group = np.asarray(env.agent_groups)
    return {
        name: float(per_agent.mean(axis=0)[agent_group == g].sum())
        for g, name in enumerate(env.group_names)
    }


def _loss(batch: dict[str, np.ndarray]) -> tuple[float, dict[str, float], object]:
    module, apply_fn = make_actor_critic("discrete", 5, 1, (16,), (16,), "tanh", 0.0)
    params = init_params(module, (6,), jax.random.PRNGKey(0))
    hp = PPOHyperparams(
        num_epochs=1,
        num_minibatches=1,
        gamma=0.99,
        gae_lambda=0.95,
        clip_eps=0.2,
        anneal_clip=False,
        value_clip_eps=0.2,
        vf_coef=0.5,
        ent_coef=0.01,
        normalize_advantages=True,
        num_updates=1,
    )
    loss_fn = make_ppo_loss(apply_fn, action_distribution("discrete"), hp)
    (total, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, {k: jnp.asarray(v) for k, v in batch.items()}, jnp.float32(0.2)
    )
    return float(total), {k: float(v) for k, v in metrics.items()}, grads


@pytest.mark.slow
def test_padding_steps_of_finished_agents_contribute_nothing_to_the_losses():
    # Two agents over 6 steps; agent 1 finishes after step 2, so its steps 3..5 are padding,
    # filled here with garbage that would dominate every loss term if it counted.
    rng = np.random.default_rng(0)
    rows = 12
    valid = np.ones(rows, np.float32)
    padding = np.array([7, 9, 11])  # agent 1's rows (odd) after its last step
    valid[padding] = 0.0
    batch = {
        "obs": rng.normal(size=(rows, 6)).astype(np.float32),
        "action": rng.integers(0, 5, rows).astype(np.int32),
        "log_prob": np.full(rows, -math.log(5), np.float32),
        "value": rng.normal(size=rows).astype(np.float32),
        "advantage": rng.normal(size=rows).astype(np.float32),
        "return": rng.normal(size=rows).astype(np.float32),
        "valid": valid,
    }
    garbage = dict(batch)
    for name, huge in (("obs", 1e3), ("value", 1e4), ("advantage", 1e5), ("return", -1e4)):
        garbage[name] = batch[name].copy()
        garbage[name][padding] = huge
    garbage["log_prob"] = batch["log_prob"].copy()
    garbage["log_prob"][padding] = -50.0
    kept = {name: np.delete(values, padding, axis=0) for name, values in batch.items()}

    total, metrics, grads = _loss(garbage)
    total_kept, metrics_kept, grads_kept = _loss(kept)
    assert total == pytest.approx(total_kept, rel=1e-5)
    for name in ("loss/policy", "loss/value", "loss/entropy", "approx_kl", "clip_fraction"):
        assert metrics[name] == pytest.approx(metrics_kept[name], rel=1e-5, abs=1e-7), name
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads, grads_kept
    )
    # and the garbage would have mattered had it counted
    counted = dict(garbage, valid=np.ones(rows, np.float32))
    assert abs(_loss(counted)[0] - total) > 1.0


def test_agent_columns_carry_observation_id_and_the_critics_part():
    env = NavigationVectorEnv(2, num_agents=3)
    centralised = AgentColumns(env, "centralised")
    obs, _ = centralised.reset(seed=4)
    first = NavigationVectorEnv(2, num_agents=3).reset(seed=4)
    d, n, s = env.obs_size, 3, env.state_size
    assert centralised.num_envs == 6 and obs.shape == (6, d + n + s)
    assert centralised.actor_obs_dim == d + n
    for e in range(2):
        for i in range(n):
            row = obs[e * n + i]
            np.testing.assert_array_equal(row[:d], first.obs[e, i])
            np.testing.assert_array_equal(row[d : d + n], np.eye(n)[i])
            np.testing.assert_array_equal(row[d + n :], first.state[e])  # the global state
    independent = AgentColumns(NavigationVectorEnv(2, num_agents=3), "independent")
    obs, _ = independent.reset(seed=4)
    assert obs.shape == (6, d + n)  # no critic part: the critic sees what the policy sees


def test_the_centralised_critic_sees_the_global_state_and_the_policy_does_not():
    from agentenv_jax.networks.numpy_policy import actor_critic_forward

    actor_dim, critic_dim = 8, 5
    module, apply_fn = make_actor_critic(
        "discrete", 5, 1, (16,), (16,), "tanh", 0.0, actor_obs_dim=actor_dim
    )
    params = init_params(module, (actor_dim + critic_dim,), jax.random.PRNGKey(0))
    assert params["actor_torso"]["Dense_0"]["kernel"].shape[0] == actor_dim
    assert params["critic_torso"]["Dense_0"]["kernel"].shape[0] == actor_dim + critic_dim
    obs = np.random.default_rng(0).normal(size=(4, actor_dim + critic_dim)).astype(np.float32)
    other_state = obs.copy()
    other_state[:, actor_dim:] += 1.0
    head, value = apply_fn(params, obs)
    head_2, value_2 = apply_fn(params, other_state)
    np.testing.assert_array_equal(head, head_2)  # the policy does not see the state
    assert np.all(np.abs(np.asarray(value) - np.asarray(value_2)) > 1e-4)  # the critic does
    # The env ranks' numpy forward slices the same way.
    np_head, np_value = actor_critic_forward(params, obs, 1, "tanh", False)
    np.testing.assert_allclose(np_head, head, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np_value, value, rtol=1e-5, atol=1e-6)


def test_the_team_return_sums_the_agents_mean_returns():
    window = EpisodeWindow(window=2, agents=2)
    returns = np.full((3, 4), np.nan)
    lengths = np.zeros((3, 4), np.int64)
    # columns: env 0 agents 0, 1; env 1 agents 0, 1
    returns[1], lengths[1] = [-1.0, -3.0, -5.0, -7.0], 25
    assert window.add(returns, lengths) == 4
    assert window.full
    assert window.return_mean == pytest.approx(-3.0 + -5.0)  # mean(-1, -5) + mean(-3, -7)
    assert window.agent_return_mean == pytest.approx(-4.0)
    restored = EpisodeWindow(window=2, agents=2)
    restored.load(window.state())
    assert restored.return_mean == window.return_mean


@pytest.mark.slow
def test_finished_agents_are_padding_in_the_segments(run_dir):
    config = load_config(
        EXPERIMENTS / "navigation_mappo.yaml",
        [
            f"run.run_dir={run_dir}",
            "run.name=prey",
            "run.progress=false",
            "env.id=agentenv_jax/PredatorPrey-v0",
            "env.global_num_envs=8",
            "run.total_env_steps=24000",
        ],
    )
    result = train(config)
    rows = result.updates * 50 * 8 * 4  # T x envs x agents (2 predators, 2 prey)
    accounting = result.accounting
    assert accounting["produced"] == accounting["trained"]  # every row produced was trained
    assert 0 < accounting["trained"] < rows  # and caught prey's steps were never produced
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    assert all(math.isfinite(r["agent_return_mean"]) for r in records[-3:])


def test_a_caught_prey_stops_acting_until_its_episode_ends():
    columns = AgentColumns(PredatorPreyVectorEnv(16, max_episode_steps=50), "centralised")
    columns.reset(seed=0)
    rng = np.random.default_rng(0)
    seen_padding = False
    for _ in range(50):
        _, reward, terminated, truncated, info = columns.step(rng.integers(0, 5, 64))
        acted = info[ACTED]
        assert not np.any(reward[~acted]) and not np.any(terminated[~acted])
        seen_padding |= not acted.all()
    assert seen_padding  # some prey were caught before the end of their episode


@pytest.mark.slow
def test_mpiexec_mappo_beats_a_random_policy_on_cooperative_navigation(run_dir):
    proc = run_command(
        [
            mpiexec_path(),
            "-n",
            "3",
            *agentenv_command(
                "train",
                "navigation_mappo",
                *settings(f"run.run_dir={run_dir}", "run.name=mappo", "run.progress=false"),
            ),
        ],
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((run_dir / "mappo" / "summary.json").read_text())
    assert summary["topology"].startswith("1 learner + 2 env rank(s), 16 envs")
    assert summary["episode_return_mean"] >= TRAINED_TEAM_RETURN > RANDOM_TEAM_RETURN
    assert summary["accounting"]["produced"] == summary["accounting"]["trained"]


@pytest.mark.slow
def test_pettingzoo_mpe_simple_spread_mappo_beats_a_random_policy(run_dir):
    _, result = _short_run(
        "simple_spread_mappo",
        run_dir,
        "mpe",
        "env.kwargs={N: 2, max_cycles: 25, continuous_actions: false}",
        "run.total_env_steps=32000",
    )
    assert result.updates == 20
    assert result.accounting["produced"] == result.accounting["trained"] == 32000
    assert result.episode_return_mean >= TRAINED_TWO_AGENT_RETURN > RANDOM_TWO_AGENT_RETURN


@pytest.mark.slow
def test_ippo_beats_a_random_policy_on_cooperative_navigation(run_dir):
    config, result = _short_run(
        "navigation_ippo",
        run_dir,
        "ippo",
        "env.kwargs={num_agents: 2}",
        "run.total_env_steps=32000",
    )
    assert config.network.critic == "independent"
    assert result.episode_return_mean >= TRAINED_TWO_AGENT_RETURN > RANDOM_TWO_AGENT_RETURN


@pytest.mark.slow
def test_a_groups_loss_does_not_reach_another_groups_policy():
    from agentenv_jax.config.schema import NetworkConfig
    from agentenv_jax.envs.spaces import EnvSpaces
    from agentenv_jax.networks import actor_critic_for

    # 3 agents, predators (group 0: agent 0) and prey (group 1: agents 1, 2); observation D = 4,
    # then the one-hot id, then a 2-entry state for the centralised critic.
    spaces = EnvSpaces(
        obs_shape=(4 + 3 + 2,),
        action_kind="discrete",
        action_size=5,
        action_shape=(),
        action_low=None,
        action_high=None,
        agents=3,
        actor_obs_dim=7,
        agent_groups=(0, 1, 1),
        group_names=("predator", "prey"),
    )
    module, apply_fn = actor_critic_for(NetworkConfig(policies="per_group"), spaces)
    params = init_params(module, spaces.obs_shape, jax.random.PRNGKey(0))
    assert set(params) == {"group_0", "group_1"}
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(6, 9)).astype(np.float32)
    obs[:, 4:7] = np.eye(3)[[0, 1, 2, 0, 1, 2]]

    def loss_of_rows(p, rows):
        head, value = apply_fn(p, obs[rows])
        return jnp.sum(head**2) + jnp.sum(value**2)

    for rows, mine, other in (([0, 3], "group_0", "group_1"), ([1, 2, 4], "group_1", "group_0")):
        grads = jax.grad(loss_of_rows)(params, rows)
        assert all(not np.any(g) for g in jax.tree.leaves(grads[other])), other
        assert any(np.any(g) for g in jax.tree.leaves(grads[mine])), mine
    # a row's outputs are its group's network's
    head, value = apply_fn(params, obs)
    single, single_apply = make_actor_critic(
        "discrete", 5, 1, (64, 64), (64, 64), "tanh", 0.0, actor_obs_dim=7
    )
    prey_head, prey_value = single_apply(params["group_1"], obs)
    np.testing.assert_allclose(head[1], prey_head[1], rtol=1e-6)
    np.testing.assert_allclose(value[2], prey_value[2], rtol=1e-6)


@pytest.mark.slow
def test_predator_prey_per_group_policies_both_beat_random_play(run_dir):
    config, result = _short_run(
        "predator_prey_mappo", run_dir, "groups", "run.total_env_steps=48000"
    )
    assert set(result.params) == {"group_0", "group_1"}
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    for name in ("predator", "prey"):
        assert all(math.isfinite(r[f"loss/policy/{name}"]) for r in records)
        assert all(r[f"loss/entropy/{name}"] > 0 for r in records)
    trained = _group_returns(config, result.params)
    assert trained["prey"] >= TRAINED_PREY_RETURN > RANDOM_PREY_RETURN, trained
    # The predators' return also rises because trained prey stay in the arena: random
    # predators against the same trained prey stay below the threshold.
    random_predators = _group_returns(config, result.params, acting=("prey",))
    assert trained["predator"] >= TRAINED_PREDATOR_RETURN > random_predators["predator"], (
        trained,
        random_predators,
    )
    assert TRAINED_PREDATOR_RETURN > RANDOM_PREDATOR_RETURN


@pytest.fixture(scope="module")
def speaker_listener(tmp_path_factory) -> tuple:
    """MPE2's speaker-listener (a speaker with Discrete(3), a listener with Discrete(5)), one
    policy per agent (group), 32k agent steps: its config and `train`'s result."""
    return _short_run(
        "simple_spread_mappo",
        tmp_path_factory.mktemp("runs"),
        "speaker",
        "env.id=pettingzoo/mpe2.simple_speaker_listener_v4",
        "env.kwargs={continuous_actions: false, max_cycles: 25}",
        "network.policies=per_group",
        "run.total_env_steps=32000",
    )


@pytest.mark.slow
def test_speaker_listener_per_agent_policies_beat_a_random_policy(speaker_listener):
    _, result = speaker_listener
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    assert all(math.isfinite(r["loss/policy/speaker"]) for r in records)
    assert all(math.isfinite(r["loss/policy/listener"]) for r in records)
    assert (
        result.episode_return_mean
        >= TRAINED_SPEAKER_LISTENER_RETURN
        > RANDOM_SPEAKER_LISTENER_RETURN
    )


@pytest.mark.slow
def test_agents_with_different_action_counts_never_choose_anothers_actions(speaker_listener):
    # The speaker's logits beyond its 3 actions are masked; the listener's 5 are all open.
    config, result = speaker_listener
    env = make_vector_env(config.env, 2, config.network.critic)
    spaces = vector_env_spaces(config.env.id, env)
    assert spaces.agent_action_counts == (3, 5) and spaces.action_size == 5
    obs, _ = env.reset(seed=0)
    env.close()
    _, apply_fn = actor_critic_for(config.network, spaces)
    head, _ = apply_fn(result.params, obs)
    head = np.asarray(head)
    assert np.all(head[0::2, 3:] <= -1e8) and np.all(head[1::2] > -1e8)  # speakers, listeners
