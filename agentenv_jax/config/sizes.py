"""How much memory a config asks one process to hold, at least, and the refusal of one that
cannot fit on its machine.

`estimate_memory` is a lower bound, a pure function of the config and (once start-up has
learnt them) the env's spaces: every term counts only what the run certainly allocates (an
env object, the observations and actions it moves, the fixed fields of a transition), never
the overheads around them. `check_memory` compares the sum with what the machine can hold
(`machine_memory`: physical memory, or the cgroup's limit where lower) and raises one
`ConfigError` naming the settings, their values, the estimate and the limit. The bound is
generous on purpose: it refuses requests that cannot possibly fit (`env.global_num_envs =
1e9`), never a large run that might.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.schema import ExperimentConfig, SACConfig

# The least one Gymnasium env object of a sync or async vector env costs: traced Python
# allocations per env of a 20,000-env SyncVectorEnv after its first reset were 5.3 KB for
# CartPole-v1 (11 KB of resident memory), 1.4-2.5 KB for the text and multi-agent envs, and
# 1.05 KB for a bare gymnasium.Env with class-level Discrete spaces. Native vector envs keep
# their envs as arrays (CartPole: ~94 bytes per env): only their observations are counted.
ENV_OBJECT_BYTES = 512

# The fields every on-policy transition carries besides its observation and action: reward,
# behaviour log-prob and value (float32), terminated and truncated (uint8). The segment spec
# (`buffers.segment_queue`) holds more (bootstrap value, episode statistics, policy version).
TRANSITION_FIXED_BYTES = 14

# A replay transition (`buffers.replay`) stores its observation and next observation and its
# action as float32, plus reward and discount (float32); item ids and generations come on top.
REPLAY_FIXED_BYTES = 8


class SpaceSizes(Protocol):
    """What the estimate reads of the env's spaces (`envs.spaces.EnvSpaces` has it all)."""

    obs_shape: tuple[int, ...]
    obs_dtype: Any
    action_shape: tuple[int, ...]
    action_dtype: Any
    agents: int


@dataclasses.dataclass(frozen=True)
class MemoryDemand:
    """One thing a process holds: what it is, the settings that size it, and its bytes."""

    what: str  # e.g. "its envs", "the learner's batch"
    settings: tuple[str, ...]  # dotted config paths, the one that matters most first
    nbytes: int
    detail: str  # how `nbytes` was counted


class MemoryLimit(NamedTuple):
    """What one machine can hold, and where that figure comes from."""

    nbytes: int
    source: str  # "physical memory", or the cgroup file that sets a lower limit


def _elements(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=object)) if shape else 1


def _sizes(config: ExperimentConfig, spaces: SpaceSizes | None) -> tuple[int, int, int, int]:
    """Entries and bytes of one observation as it travels, bytes of one action, and agents
    per env. Without the spaces, the least any env has: one uint8 observation entry (float32
    with SAC or the JAX backend), one 4-byte action, one agent."""
    if spaces is None:
        float_obs = isinstance(config.algorithm, SACConfig) or config.env.backend == "jax"
        return 1, (4 if float_obs else 1), 4, 1
    entries = _elements(spaces.obs_shape)
    obs = entries * np.dtype(spaces.obs_dtype).itemsize
    action = _elements(spaces.action_shape) * np.dtype(spaces.action_dtype).itemsize
    return entries, obs, action, max(1, int(spaces.agents))


def estimate_memory(
    config: ExperimentConfig,
    spaces: SpaceSizes | None = None,
    *,
    env_rank_envs: int | None = None,
    learner: bool = False,
) -> tuple[MemoryDemand, ...]:
    """A lower bound of what one process of the run holds, term by term: the env rank of
    `env_rank_envs` envs (None: this process is no env rank) and/or a learner (`learner`; one
    of `topology.num_learner_ranks`, its envs inside it with `env.backend: jax`).

    Env rank: its envs (`ENV_OBJECT_BYTES` each for sync/async vector envs, plus one
    observation per agent), and one on-policy segment `[T, E, agents]` or its replay
    partition (its share of `algorithm.replay_capacity`, in proportion to its envs). Learner:
    its batch, `[T, global_num_envs / L, agents]` transitions (SAC: `batch_size` replay
    transitions); with the JAX backend, also one observation per env (the envs' state).
    Without `spaces`, observations and actions count the least any env has (`_sizes`).
    """
    obs_entries, obs, action, agents = _sizes(config, spaces)
    env, algo = config.env, config.algorithm
    sac = isinstance(algo, SACConfig)
    transition = obs + action + TRANSITION_FIXED_BYTES
    replay_transition = 2 * 4 * obs_entries + action + REPLAY_FIXED_BYTES  # float32 obs
    demands = []
    if env_rank_envs is not None:
        per_env = (0 if env.vectorization == "native" else ENV_OBJECT_BYTES) + obs * agents
        demands.append(
            MemoryDemand(
                "its envs",
                ("env.global_num_envs",),
                env_rank_envs * per_env,
                f"{env_rank_envs:,} envs x {per_env:,} bytes",
            )
        )
        if sac:
            share = max(1, round(algo.replay_capacity * env_rank_envs / env.global_num_envs))
            demands.append(
                MemoryDemand(
                    "its replay partition",
                    ("algorithm.replay_capacity",),
                    share * replay_transition,
                    f"{share:,} transitions x {replay_transition:,} bytes",
                )
            )
        else:
            rows = algo.rollout_length * env_rank_envs * agents
            demands.append(
                MemoryDemand(
                    "one segment",
                    ("env.global_num_envs", "algorithm.rollout_length"),
                    rows * transition,
                    f"{rows:,} transitions x {transition:,} bytes",
                )
            )
    if learner:
        if sac:
            demands.append(
                MemoryDemand(
                    "the learner's batch",
                    ("algorithm.batch_size",),
                    algo.batch_size * replay_transition,
                    f"{algo.batch_size:,} transitions x {replay_transition:,} bytes",
                )
            )
        else:
            learners = 1 if env.backend == "jax" else config.topology.num_learner_ranks
            rows = algo.rollout_length * (env.global_num_envs // learners) * agents
            demands.append(
                MemoryDemand(
                    "the learner's batch",
                    ("env.global_num_envs", "algorithm.rollout_length"),
                    rows * transition,
                    f"{rows:,} transitions x {transition:,} bytes",
                )
            )
        if env.backend == "jax":
            per_env = obs * agents
            demands.append(
                MemoryDemand(
                    "the JAX envs' state",
                    ("env.global_num_envs",),
                    env.global_num_envs * per_env,
                    f"{env.global_num_envs:,} envs x {per_env:,} bytes",
                )
            )
    return tuple(demands)


def _cgroup_limits() -> list[tuple[int, str]]:
    """Memory limits of the cgroups this process is in and their parents (v2 `memory.max`,
    v1 `memory.limit_in_bytes`); none where there is no cgroup file system."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    candidates = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            root, name = Path("/sys/fs/cgroup"), "memory.max"
        elif "memory" in controllers.split(","):
            root, name = Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"
        else:
            continue
        folder = root / path.lstrip("/")
        # Inside a container the path may not be visible from its mount: the root stands for it.
        for parent in [folder, *folder.parents]:
            if parent == root or root in parent.parents:
                candidates.append(parent / name)
    limits = []
    for file in dict.fromkeys(candidates):
        try:
            text = file.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # v2 writes "max" for no limit
            limits.append((int(text), str(file)))
    return limits


def machine_memory() -> MemoryLimit | None:
    """What this machine lets this process hold: its physical memory, or the lowest limit of
    its cgroups where lower (a container, a Slurm job's allocation); None when unknown."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None
    limit = MemoryLimit(physical, "physical memory")
    for nbytes, source in _cgroup_limits():
        if nbytes < limit.nbytes:
            limit = MemoryLimit(nbytes, f"cgroup limit {source}")
    return limit


def _human(nbytes: int) -> str:
    value, unit = float(nbytes), "bytes"
    for next_unit in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024:
            break
        value, unit = value / 1024, next_unit
    return f"{value:.1f} {unit}" if unit != "bytes" else f"{nbytes} bytes"


def _setting(config: ExperimentConfig, path: str) -> Any:
    value: Any = config
    for name in path.split("."):
        value = getattr(value, name)
    return value


def check_memory(
    config: ExperimentConfig,
    spaces: SpaceSizes | None = None,
    *,
    env_rank_envs: int | None = None,
    learner: bool = False,
    limit: MemoryLimit | None = None,
) -> None:
    """`ConfigError` when what `estimate_memory` counts for this process (same arguments) is
    more than `limit` (default: `machine_memory()`; nothing is checked when it is unknown)."""
    demands = sorted(
        estimate_memory(config, spaces, env_rank_envs=env_rank_envs, learner=learner),
        key=lambda demand: -demand.nbytes,
    )
    limit = limit or machine_memory()
    total = sum(demand.nbytes for demand in demands)
    if limit is None or total <= limit.nbytes:
        return
    # The settings to lower: those of the terms that make a tenth of the total or more, the one
    # that sizes most of it first.
    weight: dict[str, int] = {}
    for demand in (d for d in demands if 10 * d.nbytes >= total):
        for name in demand.settings:
            weight[name] = weight.get(name, 0) + demand.nbytes
    names = sorted(weight, key=lambda name: -weight[name])
    if env_rank_envs is not None and learner and config.env.backend != "jax":
        role = "this process (learner and env rank)"
    else:
        role = "this env rank" if env_rank_envs is not None else "this learner"
    values = ", ".join(f"{name} = {_setting(config, name)!r}" for name in names)
    terms = ", ".join(f"{d.what} {_human(d.nbytes)} ({d.detail})" for d in demands)
    spread = env_rank_envs is not None and "env.global_num_envs" in names
    hint = " (or spread the envs over more env ranks)" if spread else ""
    raise ConfigError(
        f"{values} cannot fit in memory: {role} would hold at least {total:,} bytes "
        f"({_human(total)}: {terms}), more than the {limit.nbytes:,} bytes "
        f"({_human(limit.nbytes)}) this machine can hold ({limit.source}); lower "
        f"{' or '.join(names)}{hint}"
    )
