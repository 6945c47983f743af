"""Roles and per-rank sizes, computed once from the config and the world size (never written back).

Ranks `0..L-1` are learners and `L..N-1` env ranks. With one process (no launcher, a notebook)
there is one learner and one env rank living in the same process, joined by the in-process
transport.

With several learners, env rank `i` feeds learner `i % L` (round-robin, so consecutive ranks,
which launchers place on the same node, spread over learners). Each learner holds `1/L` of the
global envs, and the global env axis is learner-major: learner 0's envs first, in the order of its
env ranks, then learner 1's. That is the order of the global rollout array the learners build
together (each contributes its contiguous block), and of the env offsets that seed the envs.
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
    def multi_learner(self) -> bool:
        return self.num_learner_ranks > 1

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

    @property
    def learner_index(self) -> int:
        """This learner's index among learners (its rank)."""
        return 0 if self.single_process else self.rank

    def env_rank_of(self, index: int) -> int:
        """The MPI rank of env rank `index`."""
        return self.num_learner_ranks + index

    def learner_of(self, index: int) -> int:
        """The learner (its rank) that env rank `index` feeds."""
        return index % self.num_learner_ranks

    def learner_of_rank(self, rank: int) -> int:
        """The learner (its rank) that MPI rank `rank` belongs with: a learner itself, an env
        rank the learner it feeds."""
        if rank < self.num_learner_ranks:
            return rank
        return self.learner_of(rank - self.num_learner_ranks)

    def env_ranks_of(self, learner: int) -> list[int]:
        """The env-rank indices that feed `learner`, in global env order."""
        return list(range(learner, self.num_env_ranks, self.num_learner_ranks))

    def learner_major(self) -> list[int]:
        """Every env-rank index in global env order (learner 0's first)."""
        return [i for learner in range(self.num_learner_ranks) for i in self.env_ranks_of(learner)]


def make_topology(config: ExperimentConfig, world_size: int, rank: int) -> Topology:
    """Split the world into roles and the global envs over learners (equally) and then over
    each learner's env ranks (as evenly as possible)."""
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
    if world_size == 1:
        learners = 1  # the one process is one learner beside one env rank
    elif env_ranks < learners:
        raise ConfigError(
            f"topology.num_learner_ranks = {learners} is not allowed with {env_ranks} env "
            f"rank(s) in a world of {world_size}: every learner needs at least one env rank "
            f"(launch at least {2 * learners} processes)"
        )
    elif global_envs % learners:
        raise ConfigError(
            f"env.global_num_envs = {global_envs} is not allowed with {learners} learners: "
            f"each learner holds an equal share (a multiple of {learners})"
        )
    local = [0] * env_ranks
    offsets = [0] * env_ranks
    per_learner = global_envs // learners
    for learner in range(learners):
        feeders = list(range(learner, env_ranks, learners))
        base, extra = divmod(per_learner, len(feeders))
        offset = learner * per_learner
        for j, index in enumerate(feeders):
            local[index] = base + (1 if j < extra else 0)
            offsets[index] = offset
            offset += local[index]
    return Topology(
        world_size, rank, learners, env_ranks, global_envs, tuple(local), tuple(offsets)
    )
