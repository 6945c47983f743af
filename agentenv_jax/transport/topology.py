"""Roles and per-rank sizes, computed once from the config, the world size and the ranks' hosts
(never written back).

Ranks `0..L-1` are learners and `L..N-1` env ranks. With one process (no launcher, a notebook)
there is one learner and one env rank living in the same process, joined by the in-process
transport.

With several learners, which learner an env rank feeds depends on where the ranks run:
* on one host (or when hosts are not known), env rank `i` feeds learner `i % L` (round-robin);
* across hosts, env ranks are taken host by host (each learner's own host first, then the
  others in the order they first appear) and cut into `L` runs of consecutive ones, as equal as
  counts allow: learner `l` gets run `l`. So a learner's env ranks share as few hosts as
  possible, which is what its parameter broadcast and its segments' traffic pay for.
Each learner holds `1/L` of the global envs, and the global env axis is learner-major: learner
0's envs first, in the order of its env ranks, then learner 1's. That is the order of the global
rollout array the learners build together (each contributes its contiguous block), and of the
env offsets that seed the envs.
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
    feeds: tuple[int, ...] = ()  # the learner each env rank feeds (empty: round-robin)

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
        return self.feeds[index] if self.feeds else index % self.num_learner_ranks

    def learner_of_rank(self, rank: int) -> int:
        """The learner (its rank) that MPI rank `rank` belongs with: a learner itself, an env
        rank the learner it feeds."""
        if rank < self.num_learner_ranks:
            return rank
        return self.learner_of(rank - self.num_learner_ranks)

    def env_ranks_of(self, learner: int) -> list[int]:
        """The env-rank indices that feed `learner`, in global env order."""
        return [i for i in range(self.num_env_ranks) if self.learner_of(i) == learner]

    def learner_major(self) -> list[int]:
        """Every env-rank index in global env order (learner 0's first)."""
        return [i for learner in range(self.num_learner_ranks) for i in self.env_ranks_of(learner)]


def feeds_by_host(hosts: list[str], learners: int) -> tuple[int, ...]:
    """The learner each env rank feeds, given every rank's host (`hosts[rank]`, learners
    first): empty (round-robin) on one host, else the host-by-host runs of the module
    docstring."""
    if len(set(hosts)) <= 1 or learners == 1:
        return ()
    env_hosts = hosts[learners:]
    order = list(dict.fromkeys(hosts[:learners] + env_hosts))  # learners' hosts first
    by_host = sorted(range(len(env_hosts)), key=lambda i: (order.index(env_hosts[i]), i))
    base, extra = divmod(len(env_hosts), learners)
    feeds = [0] * len(env_hosts)
    start = 0
    for learner in range(learners):
        size = base + (1 if learner < extra else 0)
        for index in by_host[start : start + size]:
            feeds[index] = learner
        start += size
    return tuple(feeds)


def make_topology(
    config: ExperimentConfig, world_size: int, rank: int, hosts: list[str] | None = None
) -> Topology:
    """Split the world into roles and the global envs over learners (equally) and then over
    each learner's env ranks (as evenly as possible); `hosts` (each rank's, in rank order)
    lets env ranks feed the learners by host."""
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
    feeds = feeds_by_host(hosts, learners) if hosts is not None and world_size > 1 else ()
    local = [0] * env_ranks
    offsets = [0] * env_ranks
    per_learner = global_envs // learners
    for learner in range(learners):
        if feeds:
            feeders = [i for i in range(env_ranks) if feeds[i] == learner]
        else:
            feeders = list(range(learner, env_ranks, learners))
        base, extra = divmod(per_learner, len(feeders))
        offset = learner * per_learner
        for j, index in enumerate(feeders):
            local[index] = base + (1 if j < extra else 0)
            offsets[index] = offset
            offset += local[index]
    return Topology(
        world_size, rank, learners, env_ranks, global_envs, tuple(local), tuple(offsets), feeds
    )
