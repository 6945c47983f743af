"""The two sides `actor_efficiency.py` compares, in one process: a plain `policy.act` +
`vector_env.step` loop (`PlainLoop`) and the real `Actor` over the in-process transport fed by
a learner that only echoes parameters (`InProcessFramework`), with what they share
(`EnvRankSetup`) and what they clock (`Phase`, `CaseResult`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


@dataclasses.dataclass
class Phase:
    """One timed stretch of one side: wall time, vector steps, and where the time went."""

    wall_s: float
    vector_steps: int
    num_envs: int
    env_s: float = 0.0
    inference_s: float = 0.0
    transport_s: float = 0.0

    @property
    def steps_per_s(self) -> float:
        return self.vector_steps * self.num_envs / self.wall_s


@dataclasses.dataclass
class CaseResult:
    """The rounds of one (variant, vectorization, envs) case."""

    variant: str
    vectorization: str
    num_envs: int
    plain: list[Phase]
    framework: list[Phase]
    framework_timers: list[float]  # summed actor_seconds of the measured segments (see below)

    @property
    def ratios(self) -> list[float]:
        return [
            f.steps_per_s / p.steps_per_s for p, f in zip(self.plain, self.framework, strict=True)
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "vectorization": self.vectorization,
            "num_envs": self.num_envs,
            "plain": [dataclasses.asdict(p) for p in self.plain],
            "framework": [dataclasses.asdict(p) for p in self.framework],
            "framework_timers": self.framework_timers,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        return cls(
            data["variant"],
            data["vectorization"],
            data["num_envs"],
            [Phase(**p) for p in data["plain"]],
            [Phase(**p) for p in data["framework"]],
            data["framework_timers"],
        )


def timer_reader(segment_spec: Any) -> Callable[[np.ndarray], np.ndarray]:
    """Reads a segment's `actor_seconds` [3] without building every field view (which costs
    ~100 us per call), so the echoing learner stays as cheap as possible.

    NOTE: `Actor.run_once` writes these timers after it has handed the buffer to the transport,
    so a received segment carries the timers of an earlier one (the buffer's previous use,
    `max_inflight_segments + 1` segments back). Summed over many steady-state segments after a
    warm-up longer than that, the totals are still right.
    """
    probe = segment_spec.allocate()
    view = segment_spec.views(probe)["actor_seconds"]
    start = view.__array_interface__["data"][0] - probe.__array_interface__["data"][0]
    stop = start + view.nbytes
    return lambda segment: segment[start:stop].view(np.float64)


@dataclasses.dataclass
class EnvRankSetup:
    """What both sides share: config, topology, spaces, message specs and one parameter message."""

    config: Any
    topology: Any
    spaces: Any
    segment_spec: Any
    param_spec: Any
    param_message: np.ndarray  # version 0, initial parameters, empty normalizer statistics


def make_setup(
    config_path: Path, vectorization: str, num_envs: int, transport_timeout_s: float
) -> EnvRankSetup:
    """Resolve the config for this case and build the parameter message a learner would send."""
    import jax

    from agentenv_jax.buffers.segment_queue import on_policy_segment_spec
    from agentenv_jax.config.loading import load_config
    from agentenv_jax.envs import normalization as norm
    from agentenv_jax.networks import init_params
    from agentenv_jax.runtime.policies import actor_critic_network
    from agentenv_jax.runtime.roles import prepare_env_rank
    from agentenv_jax.transport.messages import param_message_spec
    from agentenv_jax.transport.topology import make_topology

    config = load_config(
        config_path,
        [
            f"env.global_num_envs={num_envs}",
            f"env.vectorization={vectorization}",
            f"run.transport_timeout_s={transport_timeout_s}",
            "run.progress=false",
        ],
    )
    topology = make_topology(config, world_size=1, rank=0)
    probe, spaces = prepare_env_rank(config, topology)
    probe.close()
    module, _, layout = actor_critic_network(config, spaces)
    # The same specs launch derives for an on-policy run with one env rank.
    segment_spec = on_policy_segment_spec(spaces, config.algorithm.rollout_length, num_envs)
    param_spec = param_message_spec(layout.num_params, spaces.obs_dim)
    params = init_params(module, spaces.obs_shape, jax.random.key(config.run.seed))
    message = param_spec.allocate()
    fields = param_spec.views(message)
    fields["version"][0] = 0
    fields["params"][:] = np.asarray(layout.ravel(params))
    for name, dim in (("obs_stats", spaces.obs_dim), ("return_stats", 1)):
        stats = norm.empty_stats(dim)
        fields[name][:] = np.concatenate([[stats.count], stats.mean, stats.m2])
    return EnvRankSetup(config, topology, spaces, segment_spec, param_spec, message)


class PlainLoop:
    """`policy.act` + `vector_env.step` and nothing else (the same policy class and env)."""

    def __init__(self, setup: EnvRankSetup):
        from agentenv_jax.envs.factory import make_vector_env
        from agentenv_jax.runtime.policies import build_actor_policy

        config, spaces, topology = setup.config, setup.spaces, setup.topology
        self._policy = build_actor_policy(config, topology, spaces)  # as the actor's own
        self._policy.set_params(setup.param_spec.views(setup.param_message)["params"])
        self._env = make_vector_env(config.env, topology.local_num_envs[0])
        self._continuous = spaces.action_kind == "continuous"
        if self._continuous:
            self._low = np.asarray(spaces.action_low, dtype=np.float32)
            self._high = np.asarray(spaces.action_high, dtype=np.float32)
        self._obs, _ = self._env.reset(seed=config.run.seed)
        self._rollout_length = config.algorithm.rollout_length

    def run_segments(self, count: int) -> Phase:
        steps = count * self._rollout_length
        env_s = inference_s = 0.0
        obs = self._obs
        started = time.perf_counter()
        for _ in range(steps):
            tick = time.perf_counter()
            action, _, _ = self._policy.act(obs)
            if self._continuous:
                action = np.clip(action, self._low, self._high)
            tock = time.perf_counter()
            obs, _, _, _, _ = self._env.step(action)
            env_s += time.perf_counter() - tock
            inference_s += tock - tick
        wall_s = time.perf_counter() - started
        self._obs = obs
        return Phase(wall_s, steps, self._env.num_envs, env_s, inference_s)

    def close(self) -> None:
        self._env.close()


class InProcessFramework:
    """The real Actor over the in-process transport, fed by a learner that only echoes params."""

    def __init__(self, setup: EnvRankSetup):
        from agentenv_jax.runtime.roles import build_actor, prepare_env_rank
        from agentenv_jax.transport.inprocess import InProcessTransport

        self._setup = setup
        config = setup.config
        vector_env, spaces = prepare_env_rank(config, setup.topology)
        self._transport = InProcessTransport(config.topology.max_inflight_segments)
        self._actor = build_actor(
            config,
            setup.topology,
            vector_env,
            spaces,
            self._transport.actor,
            setup.segment_spec,
            setup.param_spec,
        )
        self._learner = self._transport.learner
        self._message = setup.param_message.copy()
        self._version = setup.param_spec.views(self._message)["version"]
        self._learner.broadcast_params(self._message)
        self._timers = np.zeros(3)
        self._read_timers = timer_reader(setup.segment_spec)
        self._timeout_s = config.run.transport_timeout_s

    def run_segments(self, count: int) -> Phase:
        """`count` rounds of: actor fills and ships a segment; learner takes it, sends version+1."""
        rollout_length = self._setup.config.algorithm.rollout_length
        timers = np.zeros(3)
        started = time.perf_counter()
        for _ in range(count):
            self._actor.run_once()
            (segment,) = self._learner.receive_round(self._timeout_s)
            timers += self._read_timers(segment)
            self._learner.release_round()
            self._version[0] += 1
            self._learner.broadcast_params(self._message)
        wall_s = time.perf_counter() - started
        self._timers += timers
        num_envs = self._setup.topology.local_num_envs[0]
        return Phase(wall_s, count * rollout_length, num_envs, *timers)

    def take_timers(self) -> list[float]:
        timers, self._timers = self._timers, np.zeros(3)
        return timers.tolist()

    def close(self) -> None:
        self._learner.request_stop()
        self._actor.run_once()
        self._actor.finish()
        self._learner.collect_final_reports(self._timeout_s)


def merge(phases: list[Phase]) -> Phase:
    """The phases of one side in one round, as one."""
    return Phase(
        sum(p.wall_s for p in phases),
        sum(p.vector_steps for p in phases),
        phases[0].num_envs,
        sum(p.env_s for p in phases),
        sum(p.inference_s for p in phases),
        sum(p.transport_s for p in phases),
    )
