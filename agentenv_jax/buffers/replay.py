"""The replay partition of one env rank: a preallocated ring of transitions with priorities.

Each env rank owns one partition (capacity = total capacity / number of env ranks); the global
buffer is their union and is never pooled. A partition turns vector-env steps into (optionally
n-step) transitions, stores them, samples them uniformly or in proportion to `priority^alpha`
(a sum tree), and takes new priorities for items it handed out — unless the slot has been
overwritten since, which the slot's generation number reveals.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from agentenv_jax.buffers import sum_tree

PRIORITY_EPS = 1e-6  # keeps every stored item sampleable after a zero TD error


@dataclasses.dataclass
class ReplayCounters:
    """What happened to transitions in this partition."""

    inserted: int = 0  # transitions written by this run's env steps
    restored: int = 0  # transitions loaded from a saved partition when the run resumed
    overwritten: int = 0  # transitions evicted by the ring wrapping around
    sampled: int = 0  # rows handed out by `sample`
    priority_updates: int = 0  # new priorities applied
    stale_priority_updates: int = 0  # ignored: the slot was overwritten after it was sampled
    dropped: int = 0  # steps of n-step windows discarded because their episode faulted


class ReplayPartition:
    """Ring buffer + sum tree. Fields: `obs`, `action`, `reward` (n-step return), `next_obs`,
    `discount` (`gamma^k` for a k-step transition, 0 after a terminal state), `item_id`."""

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        action_dim: int,
        *,
        prioritized: bool,
        alpha: float,
        n_step: int,
        gamma: float,
        num_envs: int,
    ):
        if capacity < 1:
            raise ValueError(f"replay partition capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.prioritized = prioritized
        self.alpha = alpha
        self.n_step = n_step
        self.gamma = gamma
        self.obs = np.zeros((capacity, *obs_shape), np.float32)
        self.next_obs = np.zeros((capacity, *obs_shape), np.float32)
        self.action = np.zeros((capacity, action_dim), np.float32)
        self.reward = np.zeros(capacity, np.float32)
        self.discount = np.zeros(capacity, np.float32)
        self.item_id = np.full(capacity, -1, np.int64)
        self.generation = np.zeros(capacity, np.int64)  # bumped when a slot is overwritten
        self.tree = sum_tree.make_sum_tree(capacity) if prioritized else None
        self.max_priority = 1.0  # new items get the largest priority seen (Schaul et al.)
        self.size = 0
        self.counters = ReplayCounters()
        # n-step staging per env: the last < n (obs, action, reward) of its current episode.
        self._pending: list[list[tuple[np.ndarray, np.ndarray, float]]] = [
            [] for _ in range(num_envs)
        ]

    @property
    def mass(self) -> float:
        """Sampling weight of this partition: total priority^alpha, or the item count."""
        return sum_tree.total(self.tree) if self.prioritized else float(self.size)

    @property
    def pending(self) -> int:
        """Steps held for n-step returns, not yet transitions."""
        return sum(len(p) for p in self._pending)

    def insert(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_obs: np.ndarray,
        discount: np.ndarray,
    ) -> None:
        """Write `k` transitions (arrays with leading axis k) at the ring's head."""
        count = len(reward)
        head = self.counters.restored + self.counters.inserted
        slots = (head + np.arange(count)) % self.capacity
        overwritten = int(np.sum(self.item_id[slots] >= 0))
        self.obs[slots] = obs
        self.action[slots] = action.reshape(count, -1)
        self.reward[slots] = reward
        self.next_obs[slots] = next_obs
        self.discount[slots] = discount
        self.item_id[slots] = head + np.arange(count)  # unique: the item's place in the ring
        self.generation[slots] += 1
        if self.prioritized:
            sum_tree.update(self.tree, slots, np.full(count, self.max_priority**self.alpha))
        self.counters.inserted += count
        self.counters.overwritten += overwritten
        self.size = min(self.capacity, self.size + count)

    def add_step(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        valid: np.ndarray | None = None,
    ) -> None:
        """Record one vector-env step `[E, ...]`; `next_obs` must be the real next (final)
        observation, not the auto-reset one; rows with `valid` False (auto-reset padding) are
        skipped. Emits n-step transitions as they complete."""
        valid = np.ones(len(reward), bool) if valid is None else np.asarray(valid, bool)
        if self.n_step == 1:
            if valid.any():
                discount = np.where(terminated, 0.0, self.gamma).astype(np.float32)
                self.insert(
                    obs[valid], action[valid], reward[valid], next_obs[valid], discount[valid]
                )
            return
        out: list[tuple] = []
        for env in np.flatnonzero(valid):
            window = self._pending[env]
            window.append((obs[env], action[env], float(reward[env])))
            ended = bool(terminated[env] or truncated[env])
            while window and (len(window) == self.n_step or ended):
                steps = len(window)
                ret = sum(r * self.gamma**k for k, (_, _, r) in enumerate(window))
                discount = 0.0 if terminated[env] else self.gamma**steps
                first_obs, first_action, _ = window.pop(0)
                out.append((first_obs, first_action, ret, next_obs[env], discount))
        if out:
            o, a, r, n, d = (np.asarray(x) for x in zip(*out, strict=True))
            self.insert(o, a, r.astype(np.float32), n, d.astype(np.float32))

    def snapshot(self) -> dict[str, np.ndarray]:
        """The stored transitions, oldest first, with their sampling priorities
        (priority^alpha; ones when uniform) and `max_priority`: what `restore` takes back."""
        head = self.counters.restored + self.counters.inserted
        order = (head - self.size + np.arange(self.size)) % self.capacity
        if self.prioritized:
            priority = sum_tree.leaf_priorities(self.tree, order)
        else:
            priority = np.ones(self.size)
        return {
            "obs": self.obs[order],
            "action": self.action[order],
            "reward": self.reward[order],
            "next_obs": self.next_obs[order],
            "discount": self.discount[order],
            "priority": priority,
            "max_priority": np.float64(self.max_priority),
        }

    def restore(self, snapshots: list[dict[str, np.ndarray]]) -> None:
        """Fill this (empty) partition from saved ones, concatenated in order; when they hold
        more than `capacity`, the last `capacity` transitions are kept."""
        if self.size or self.counters.inserted:
            raise ValueError("restore needs an empty replay partition")
        if not snapshots:
            return
        fields = {
            name: np.concatenate([snap[name] for snap in snapshots])[-self.capacity :]
            for name in ("obs", "action", "reward", "next_obs", "discount", "priority")
        }
        count = len(fields["reward"])
        if fields["obs"].shape[1:] != self.obs.shape[1:] or (
            fields["action"].shape[1:] != self.action.shape[1:]
        ):
            raise ValueError(
                f"saved transitions have observations {fields['obs'].shape[1:]} and actions "
                f"{fields['action'].shape[1:]}; this partition holds {self.obs.shape[1:]} and "
                f"{self.action.shape[1:]}"
            )
        for name in ("obs", "action", "reward", "next_obs", "discount"):
            getattr(self, name)[:count] = fields[name]
        self.item_id[:count] = np.arange(count)
        self.generation[:count] = 1
        if self.prioritized:
            sum_tree.update(self.tree, np.arange(count), fields["priority"])
            self.max_priority = max(float(snap["max_priority"]) for snap in snapshots)
        self.size = count
        self.counters.restored = count

    def drop_pending(self, env: int) -> None:
        """Forget env `env`'s unfinished n-step window (its episode was cut by a fault)."""
        self.counters.dropped += len(self._pending[env])
        self._pending[env].clear()

    def sample(self, count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """`count` items drawn i.i.d. (uniform, or proportional to priority^alpha), with their
        `slot`, `generation` and sampling weight `priority` (priority^alpha; 1 when uniform)."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay partition")
        if self.prioritized:
            slots = sum_tree.sample(self.tree, count, rng)
            priority = sum_tree.leaf_priorities(self.tree, slots)
        else:
            slots = rng.integers(0, self.size, size=count)
            priority = np.ones(count)
        self.counters.sampled += count
        return {
            "slot": slots,
            "generation": self.generation[slots],
            "priority": priority,
            "item_id": self.item_id[slots],
            "obs": self.obs[slots],
            "action": self.action[slots],
            "reward": self.reward[slots],
            "next_obs": self.next_obs[slots],
            "discount": self.discount[slots],
        }

    def update_priorities(
        self, slots: np.ndarray, generations: np.ndarray, td_errors: np.ndarray
    ) -> None:
        """Set priority |td| + eps for items still in their slot; stale ones are counted."""
        if not self.prioritized:
            return
        current = self.generation[slots] == generations
        priorities = np.abs(td_errors[current]) + PRIORITY_EPS
        if priorities.size:
            sum_tree.update(self.tree, slots[current], priorities**self.alpha)
            self.max_priority = max(self.max_priority, float(priorities.max()))
        self.counters.priority_updates += int(current.sum())
        self.counters.stale_priority_updates += int((~current).sum())


def importance_weights(
    priorities: np.ndarray,
    total_mass: float | np.ndarray,
    num_items: int,
    beta: float,
    smallest_probability: float | None = None,
) -> np.ndarray:
    """Prioritized-replay importance weights `(N P(i))^-beta / max`, over the global buffer.

    `priorities` are the sampled items' priority^alpha, `total_mass` the mass their draw was
    in proportion to (`draw_masses`: the sum over every partition for one learner), `num_items`
    the global item count; normalized by the batch maximum: that of these rows, or the one of
    a batch drawn in parts whose smallest draw probability is `smallest_probability`.
    """
    probabilities = priorities / total_mass
    weights = (num_items * probabilities) ** (-beta)
    largest = (
        weights.max()
        if smallest_probability is None
        else ((num_items * smallest_probability) ** (-beta))
    )
    return (weights / largest).astype(np.float32)


def split_batch(batch_size: int, masses: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """How many of a global batch each partition draws: multinomial in their masses, so the
    union of the partitions' i.i.d. draws is an i.i.d. draw from the global distribution."""
    masses = np.asarray(masses, dtype=np.float64)
    if masses.sum() <= 0:
        raise ValueError("cannot split a batch over partitions that are all empty")
    return rng.multinomial(batch_size, masses / masses.sum())


def split_batch_by_learner(
    batch_size: int, masses: np.ndarray, per_learner: list[int], rng: np.random.Generator
) -> np.ndarray:
    """How many of a batch each partition draws when learners hold blocks of partitions
    (`per_learner[l]` of them, learner-major) and each trains on an equal share of the rows,
    all from its own: learner by learner, a multinomial of `batch_size / L` in its partitions'
    masses (one learner: `split_batch`). Every learner computes the same counts from the same
    generator. An item's probability per draw is then its mass over `L` times its learner's
    (`draw_masses`), which the importance weights correct for."""
    if len(per_learner) == 1:
        return split_batch(batch_size, masses, rng)
    share = batch_size // len(per_learner)
    bounds = np.cumsum([0, *per_learner])
    return np.concatenate(
        [
            split_batch(share, masses[start:end], rng)
            for start, end in zip(bounds[:-1], bounds[1:], strict=True)
        ]
    )


def draw_masses(masses: np.ndarray, per_learner: list[int]) -> np.ndarray:
    """Per partition, the mass its items' draw probability is relative to under
    `split_batch_by_learner`: `L` times the total mass of its learner's partitions (one
    learner: the global mass)."""
    bounds = np.cumsum([0, *per_learner])
    return np.concatenate(
        [
            np.full(end - start, len(per_learner) * masses[start:end].sum())
            for start, end in zip(bounds[:-1], bounds[1:], strict=True)
        ]
    )
