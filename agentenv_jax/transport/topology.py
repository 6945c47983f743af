"""Roles and per-rank sizes, computed once from the config and the world size (never written back).

Ranks `0..L-1` are learners and `L..N-1` env ranks. With one process (no launcher, a notebook)
there is one learner and one env rank living in the same process, joined by the in-process
transport.
"""

from __future__ import annotations

import dataclasses

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.schema import ExperimentConfig


@dataclasses.dataclass(frozen=True)
class Topology:
    """Who does what. `local_*` quantities are per env rank, `global_*` over all of them."""

    world_size: int  # MPI processes (1 without a launcher)
    rank: int  # this process
    num_learner_ranks: int
    num_env_ranks: int
    global_num_envs: int
    local_num_envs: tuple[int, ...]  # envs on each env rank, indexed by env-rank index
    env_offsets: tuple[int, ...]  # global index of each env rank's first env

    @property
    def single_process(self) -> bool:
        return self.world_size == 1

    @property
    def is_learner(self) -> bool:
        return self.single_process or self.rank < self.num_learner_ranks

    @property
    def is_env_rank(self) -> bool:
        return self.single_process or self.rank >= self.num_learner_ranks

    @property
    def is_lead(self) -> bool:
        """The rank that prints progress and writes the run directory."""
        return self.rank == 0

    @property
    def env_rank_index(self) -> int:
        """This process's index among env ranks (0 in one-process mode)."""
        return 0 if self.single_process else self.rank - self.num_learner_ranks

    def env_rank_of(self, index: int) -> int:
        """The MPI rank of env rank `index`."""
        return self.num_learner_ranks + index


def make_topology(config: ExperimentConfig, world_size: int, rank: int) -> Topology:
    """Split the world into roles and the global envs over env ranks (as evenly as possible)."""
    learners = config.topology.num_learner_ranks
    if world_size == 1:
        env_ranks = 1
    else:
        env_ranks = world_size - learners
        if env_ranks < 1:
            raise ConfigError(
                f"topology.num_learner_ranks = {learners} leaves no env rank in a world of "
                f"{world_size} processes: launch at least {learners + 1} processes"
            )
    global_envs = config.env.global_num_envs
    if global_envs < env_ranks:
        raise ConfigError(
            f"env.global_num_envs = {global_envs} is not allowed with {env_ranks} env ranks: "
            f"expected at least one env per env rank (>= {env_ranks})"
        )
    base, extra = divmod(global_envs, env_ranks)
    local = tuple(base + (1 if i < extra else 0) for i in range(env_ranks))
    offsets = tuple(sum(local[:i]) for i in range(env_ranks))
    return Topology(world_size, rank, learners, env_ranks, global_envs, local, offsets)
