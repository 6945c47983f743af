"""The learner's side of `replay_sampling.py`'s sampling path, and its baselines: each draws
batches back to back and clocks them (`Chunk`).

* `Sampler`: `ReplayLearner.run_once` without the update, over a replay learner channel (MPI or
  in-process): request, wait, gather, prefetch the next request, importance weights and new
  priorities;
* `DirectSampler`: one `ReplayPartition` sampled by direct calls, the floor of any transport.
"""

from __future__ import annotations

import dataclasses
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np

PRIORITY_BETA = 0.4


@dataclasses.dataclass
class Chunk:
    """One timed stretch of one side: batches back to back."""

    seconds: float
    rows: int
    waits: list[float]


def busy(seconds: float) -> None:
    """Keep the CPU busy for `seconds` (a stand-in for an update's compute)."""
    if seconds <= 0:
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Sampler:
    """The learner's side of the sampling path, as `ReplayLearner.run_once` does it, minus the
    update: request, wait, gather, prefetch the next request, importance weights, priorities."""

    def __init__(
        self,
        channel: Any,
        specs: types.SimpleNamespace,
        num_partitions: int,
        batch_size: int,
        prioritized: bool,
        seed: int,
        timeout_s: float,
        serve: Callable[[], Any] | None = None,
    ):
        from agentenv_jax.transport.messages import REPLAY_COUNTERS

        self._channel = channel
        self._specs = specs
        self._batch_size = batch_size
        self._prioritized = prioritized
        self._timeout_s = timeout_s
        self._serve = serve  # in-process: the env rank's turn, in this thread
        self._rng = np.random.default_rng([seed, 91])
        self._requests = [specs.request.allocate() for _ in range(num_partitions)]
        self._priorities = specs.priority.allocate()
        self._request_id = 0
        self._size_index = REPLAY_COUNTERS.index("size")
        self._produced_index = REPLAY_COUNTERS.index("produced")
        self.allowance = np.zeros(num_partitions, np.int64)
        self.masses = np.zeros(num_partitions)
        self.sizes = np.zeros(num_partitions, np.int64)
        self.produced = np.zeros(num_partitions, np.int64)
        self.actor_seconds = np.zeros((num_partitions, 3))
        self.counts = np.zeros(num_partitions, np.int64)
        self.requested_rows = 0  # rows asked for (every request is answered before the stop)

    def send(self, counts: np.ndarray) -> None:
        self._request_id += 1
        for i, message in enumerate(self._requests):
            fields = self._specs.request.views(message)
            fields["request_id"][0] = self._request_id
            fields["count"][0] = counts[i]
            fields["insert_allowance"][0] = self.allowance[i]
        self.counts = counts
        self.requested_rows += int(counts.sum())
        self._channel.send_requests(self._requests)

    def send_next(self) -> None:
        """Request the next batch, split by the masses the partitions last reported."""
        from agentenv_jax.buffers.replay import split_batch

        self.send(split_batch(self._batch_size, self.masses, self._rng))

    def receive(self) -> tuple[list[dict[str, np.ndarray]], float]:
        """The answers to the outstanding request and the seconds spent waiting for them."""
        tick = time.perf_counter()
        if self._serve is not None:
            self._serve()
        answers = self._channel.wait_answers(self._timeout_s)
        wait = time.perf_counter() - tick
        views = [self._specs.answer.views(a) for a in answers]
        for i, answer in enumerate(views):
            self.masses[i] = answer["mass"][0]
            self.sizes[i] = answer["counters"][self._size_index]
            self.produced[i] = answer["counters"][self._produced_index]
            self.actor_seconds[i] = answer["actor_seconds"]
        return views, wait

    def gather(self, views: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The global batch, concatenated as the learner does (before the buffers are reused)."""
        from agentenv_jax.learner.replay_loop import BATCH_FIELDS

        return {
            name: np.concatenate([v[name][:c] for v, c in zip(views, self.counts, strict=True)])
            for name in (*BATCH_FIELDS, "priority", "slot", "generation")
        }

    def use(self, batch: dict[str, np.ndarray], counts: np.ndarray) -> None:
        """What the learner does around an update, without the update: importance weights and
        new priorities (random TD errors) for each partition's rows."""
        from agentenv_jax.buffers.replay import importance_weights

        if not self._prioritized:
            return
        importance_weights(
            batch["priority"], float(self.masses.sum()), int(self.sizes.sum()), PRIORITY_BETA
        )
        td_errors = self._rng.exponential(size=len(batch["reward"])).astype(np.float32)
        offset = 0
        for i, count in enumerate(counts):
            if count:
                fields = self._specs.priority.views(self._priorities)
                fields["count"][0] = count
                rows = slice(offset, offset + count)
                fields["slot"][:count] = batch["slot"][rows]
                fields["generation"][:count] = batch["generation"][rows]
                fields["td_error"][:count] = td_errors[rows]
                self._channel.send_priorities(i, self._priorities)
            offset += count

    def chunk(self, num_batches: int, work_s: float) -> Chunk:
        """`num_batches` batches back to back, each requested before the previous is used."""
        waits = []
        rows = 0
        started = time.perf_counter()
        self.send_next()
        for k in range(num_batches):
            views, wait = self.receive()
            waits.append(wait)
            counts = self.counts
            batch = self.gather(views)
            if k + 1 < num_batches:
                self.send_next()  # prefetch: the partitions draw batch k+1 while k is used
            self.use(batch, counts)
            busy(work_s)
            rows += int(counts.sum())
        return Chunk(time.perf_counter() - started, rows, waits)

    def fill(self, targets: np.ndarray, timeout_s: float) -> None:
        """Grant each partition `targets` inserts and poll (zero-row requests) until they are in."""
        self.allowance[:] = targets
        deadline = time.monotonic() + timeout_s
        while True:
            self.send(np.zeros_like(targets))
            self.receive()
            if np.all(self.produced >= targets):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"prefill stalled at {self.produced} of {targets}")
            time.sleep(0.02)


class DirectSampler:
    """One `ReplayPartition` sampled by direct calls: the floor of any transport."""

    def __init__(self, partition: Any, batch_size: int, seed: int):
        self._partition = partition
        self._batch_size = batch_size
        self._rng = np.random.default_rng([seed, 92])

    def chunk(self, num_batches: int, work_s: float) -> Chunk:
        from agentenv_jax.buffers.replay import importance_weights

        partition = self._partition
        waits = []
        started = time.perf_counter()
        for _ in range(num_batches):
            tick = time.perf_counter()
            rows = partition.sample(self._batch_size, self._rng)
            waits.append(time.perf_counter() - tick)
            if partition.prioritized:
                importance_weights(rows["priority"], partition.mass, partition.size, PRIORITY_BETA)
                td_errors = self._rng.exponential(size=self._batch_size).astype(np.float32)
                partition.update_priorities(rows["slot"], rows["generation"], td_errors)
            busy(work_s)
        return Chunk(time.perf_counter() - started, num_batches * self._batch_size, waits)


def fill_synthetic(partition: Any, seed: int) -> None:
    """Fill a partition to capacity with random transitions (values do not matter here)."""
    rng = np.random.default_rng([seed, 93])
    obs_shape, action_dim = partition.obs.shape[1:], partition.action.shape[1]
    left = partition.capacity
    while left:
        count = min(left, 10_000)
        partition.insert(
            rng.standard_normal((count, *obs_shape), dtype=np.float32),
            rng.uniform(-1, 1, (count, action_dim)).astype(np.float32),
            rng.standard_normal(count, dtype=np.float32),
            rng.standard_normal((count, *obs_shape), dtype=np.float32),
            np.full(count, 0.99, np.float32),
        )
        left -= count
