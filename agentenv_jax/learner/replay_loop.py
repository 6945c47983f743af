"""The learner loop in replay mode (SAC): sample a global batch from every partition, update on
the device mesh, send new priorities back, and pace sampling against inserting.

Each round the learner asks every partition for its share of the next batch — a multinomial
split by the priority masses the partitions reported with their last answers — and, before
training on the batch it just received, already sends the request for the next one (prefetch).
Priorities computed from a batch therefore reach the partitions one round later; like Ape-X,
sampling uses priorities at most one update old. Sampling is paced against inserting by
`learner.rate_limit`.
"""

from __future__ import annotations

import collections
import math
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from agentenv_jax.buffers.replay import draw_masses, importance_weights, split_batch_by_learner
from agentenv_jax.config.schema import ExperimentConfig, SACConfig
from agentenv_jax.envs.factory import EnvSpaces
from agentenv_jax.learner.guards import check_finite
from agentenv_jax.learner.rate_limit import insert_allowance, may_sample
from agentenv_jax.learner.sac_training import make_sac_training
from agentenv_jax.metrics.accounting import ReplayAccounting
from agentenv_jax.metrics.logger import (
    MetricsWriter,
    ProgressLine,
    SteadyRate,
    progress_fields,
)
from agentenv_jax.metrics.process_usage import env_rank_usage
from agentenv_jax.parallel.mesh import (
    BATCH_AXIS,
    local_rows,
    make_mesh,
    replicated,
    spans_processes,
    to_global,
)
from agentenv_jax.transport.base import LearnerGroup, SoloLearnerGroup, gather_final_reports
from agentenv_jax.transport.messages import REPLAY_COUNTERS, sample_summary_spec
from agentenv_jax.transport.spec import MessageSpec

BATCH_FIELDS = ("obs", "action", "reward", "next_obs", "discount")


class ReplayLearner:
    """Owns the SAC train state on the mesh; drives the sharded replay over a replay channel.

    With several learner processes (`group`), partitions are numbered learner-major
    (`partitions_per_learner`) and each learner talks to its own. Each round the learners
    exchange only their partitions' summaries (masses, counters, episodes:
    `sample_summary_spec`) and the smallest draw probability among their rows, so all of them
    hold the same counters and masses; the rows stay where they were drawn. Each learner draws
    an equal share of the batch from its own partitions (`split_batch_by_learner`, the same
    generator on every learner), feeds those rows to the global mesh as its block, and sends
    their priorities back; the importance weights correct for the per-learner draw.
    """

    def __init__(
        self,
        config: ExperimentConfig,
        spaces: EnvSpaces,
        channel: Any,
        param_spec: MessageSpec,
        request_spec: MessageSpec,
        answer_spec: MessageSpec,
        priority_spec: MessageSpec,
        local_num_envs: tuple[int, ...],
        num_devices: int,
        writer: MetricsWriter | None,
        progress: ProgressLine | None,
        group: LearnerGroup | None = None,
        partitions_per_learner: list[int] | None = None,
    ):
        algo = config.algorithm
        assert isinstance(algo, SACConfig)
        self._group = group or SoloLearnerGroup()
        per_learner = partitions_per_learner or [len(local_num_envs)]
        first = sum(per_learner[: self._group.index])
        self._own = range(first, first + per_learner[self._group.index])  # global indices
        self._per_learner = per_learner
        self.config = config
        self._algo = algo
        self._channel = channel
        self._param_spec = param_spec
        self._request_spec = request_spec
        self._answer_spec = answer_spec
        self._priority_spec = priority_spec
        self._summary_spec = sample_summary_spec()
        self._exchange_bytes = 0  # what this learner received from the others' last round
        self._writer = writer
        self._progress = progress
        self._num_partitions = len(local_num_envs)
        self._env_share = np.asarray(local_num_envs, np.float64) / sum(local_num_envs)
        self._global_num_envs = sum(local_num_envs)
        self._rng = np.random.default_rng([config.run.seed, 91])
        # Updates the budget allows at the configured ratio (for the progress line and beta).
        self.num_updates = max(
            1,
            math.ceil(
                (config.run.total_env_steps - algo.learning_starts)
                * algo.samples_per_insert
                / algo.batch_size
            ),
        )

        self.mesh = make_mesh(num_devices)
        batch_shapes = {
            name: jax.ShapeDtypeStruct(answer_spec[name].shape, answer_spec[name].dtype)
            for name in BATCH_FIELDS
        } | {"weight": jax.ShapeDtypeStruct((algo.batch_size,), np.float32)}
        training = make_sac_training(config, spaces, self.mesh, batch_shapes)
        self._global_batch = spans_processes(self.mesh)
        self._row_sharding = NamedSharding(self.mesh, PartitionSpec(BATCH_AXIS))
        self._update = training.update
        self._ravel_actor = training.ravel_actor
        self.state = training.initial_state

        self._param_message = param_spec.allocate()
        self._requests = [request_spec.allocate() for _ in self._own]
        self._priorities = priority_spec.allocate()
        self._requested = np.zeros(self._num_partitions, np.int64)
        self._request_id = 0
        self._counters = np.zeros((self._num_partitions, len(REPLAY_COUNTERS)), np.int64)
        self._masses = np.zeros(self._num_partitions)
        self._actor_seconds = np.zeros((self._num_partitions, 3))
        self._returns: collections.deque[float] = collections.deque(maxlen=config.run.return_window)
        self._lengths: collections.deque[int] = collections.deque(maxlen=config.run.return_window)
        self._env_steps_before = 0  # from the checkpoint a resumed run started at
        self._save_replay_at: int | None = None  # checkpoint the partitions are to be saved for
        self._heard_from_partitions = False
        self._trained_before = 0
        self.sampled = 0  # rows requested and received
        self.trained = 0  # rows consumed by updates
        self.updates = 0
        self.episodes = 0
        self.done = False
        self.accounting: ReplayAccounting | None = None
        # Per env rank, at the end: CPU share, peak memory, JAX loaded (`env_rank_usage`).
        self.env_rank_usage: dict[str, list] | None = None
        self.last_record: dict[str, Any] = {}
        self._start_time = time.perf_counter()
        self.steady_rate = SteadyRate()  # steps/s once the first update has compiled
        self._wait_s = 0.0
        self._update_s = 0.0

    def _counter(self, name: str) -> int:
        return int(self._counters[:, REPLAY_COUNTERS.index(name)].sum())

    @property
    def env_steps(self) -> int:
        """Env steps over the whole run, resumed sessions included."""
        return self._env_steps_before + self.session_env_steps

    @property
    def session_env_steps(self) -> int:
        """Env steps since this process started (or resumed) the run."""
        return self._counter("produced")

    @property
    def env_faults(self) -> int:
        return self._counter("env_faults")

    @property
    def episode_return_mean(self) -> float:
        return float(np.mean(self._returns)) if self._returns else float("nan")

    def params(self) -> Any:
        """The current actor parameters as a host pytree."""
        return jax.device_get(self.state.actor_params)

    def checkpoint_meta(self) -> dict[str, Any]:
        """Counters and windows to continue from. Replay contents are saved by the env ranks
        themselves, if at all (`checkpoint_saved`)."""
        return {
            "updates": self.updates,
            "trained": self._trained_before + self.trained,
            "episodes": self.episodes,
            "env_steps": self.env_steps,
            "returns": list(self._returns),
            "lengths": list(self._lengths),
        }

    def checkpoint_saved(self, update: int) -> None:
        """Have every partition saved for checkpoint `update` (`checkpoint.save_replay`): the
        next sample request, or the stop request if none follows, carries the word."""
        self._save_replay_at = update

    def _learning_starts(self) -> int:
        """Transitions to insert before sampling: fewer by those restored from saved
        partitions, which count toward the fill (but not toward the sample ratio)."""
        return max(0, self._algo.learning_starts - self._counter("restored"))

    def restore(self, state: Any, meta: dict[str, Any]) -> None:
        """Continue from a checkpoint: learner state, counters and the env-step budget."""
        self.state = jax.device_put(state, replicated(self.mesh))
        self.updates, self.episodes = int(meta["updates"]), int(meta["episodes"])
        self._trained_before = int(meta["trained"])
        self._env_steps_before = int(meta["env_steps"])
        self._returns.extend(meta["returns"])
        self._lengths.extend(meta["lengths"])

    def start(self) -> None:
        self._start_time = time.perf_counter()
        self._broadcast()
        self._send_requests(np.zeros(self._num_partitions, np.int64))

    def _broadcast(self) -> None:
        fields = self._param_spec.views(self._param_message)
        fields["version"][0] = self.updates
        fields["params"][:] = np.asarray(self._ravel_actor(self.state.actor_params))
        check_finite(self.updates, {}, fields["params"])
        self._channel.broadcast_params(self._param_message)

    def _send_requests(self, counts: np.ndarray) -> None:
        self._request_id += 1
        # Until the partitions have answered once, nothing may be inserted: how much fill is
        # still to come depends on how many transitions they restored.
        allowance = 0
        if self._heard_from_partitions:
            allowance = insert_allowance(
                self._algo.batch_size,
                self._algo.samples_per_insert,
                self.sampled + int(counts.sum()),
                self._global_num_envs,
                self._learning_starts(),
            )
        save_at, self._save_replay_at = self._save_replay_at, None
        for i, message in zip(self._own, self._requests, strict=True):
            fields = self._request_spec.views(message)
            fields["request_id"][0] = self._request_id
            fields["count"][0] = counts[i]
            fields["insert_allowance"][0] = math.ceil(allowance * self._env_share[i])
            fields["save_replay"][0] = save_at is not None
            fields["save_replay_update"][0] = save_at or 0
        self._requested = counts
        self._channel.send_requests(self._requests)

    def _next_counts(self) -> np.ndarray:
        inserted = self._counter("inserted")
        budget_left = self.env_steps < self.config.run.total_env_steps
        # Every learner draws from its own partitions: each needs some mass.
        if (
            budget_left
            and draw_masses(self._masses, self._per_learner).min() > 0
            and may_sample(
                self._algo.samples_per_insert, self.sampled, inserted, self._learning_starts()
            )
        ):
            return split_batch_by_learner(
                self._algo.batch_size, self._masses, self._per_learner, self._rng
            )
        return np.zeros(self._num_partitions, np.int64)

    def run_once(self) -> dict[str, Any] | None:
        """Take the answers to the last request, request the next batch, train on this one."""
        tick = time.perf_counter()
        answers = self._channel.wait_answers(self.config.run.transport_timeout_s)
        own = [self._answer_spec.views(a) for a in answers]
        counts = self._requested
        own_counts = counts[self._own.start : self._own.stop]
        batch = None
        if counts.sum() > 0:
            batch = {
                name: np.concatenate([v[name][:c] for v, c in zip(own, own_counts, strict=True)])
                for name in (*BATCH_FIELDS, "priority", "slot", "generation")
            }
            # The mass these rows were drawn in proportion to (`draw_masses`), from this round's
            # answers as the weights have always used.
            batch["draw_mass"] = np.repeat(
                self._group.size * sum(float(v["mass"][0]) for v in own), len(batch["priority"])
            )
        summaries, smallest = self._all_summaries(answers, own, batch)
        self._wait_s += time.perf_counter() - tick
        for i, summary in enumerate(summaries):
            self._counters[i] = summary["counters"]
            self._masses[i] = summary["mass"][0]
            self._actor_seconds[i] = summary["actor_seconds"]
            reported = int(min(summary["num_episodes"][0], len(summary["episode_return"])))
            self._returns.extend(summary["episode_return"][:reported].tolist())
            self._lengths.extend(summary["episode_length"][:reported].tolist())
            self.episodes += int(summary["num_episodes"][0])
        self._heard_from_partitions = True
        if batch is not None:
            self.sampled += int(counts.sum())
        # Prefetch: the partitions draw the next batch while this one trains.
        self._send_requests(self._next_counts())
        if batch is None:
            self.done = self.env_steps >= self.config.run.total_env_steps and (
                self._requested.sum() == 0
            )
            if not self.done and self._requested.sum() == 0:
                self._channel.idle()
            return None
        return self._train(batch, own_counts, int(counts.sum()), smallest)

    def _all_summaries(
        self,
        answers: list[np.ndarray],
        own: list[dict[str, np.ndarray]],
        batch: dict[str, np.ndarray] | None,
    ) -> tuple[list[dict[str, np.ndarray]], float | None]:
        """Every partition's summary this round, learner-major, and the smallest draw
        probability among the whole batch's rows (None with one learner: the weights take the
        batch's own maximum). Several learners exchange these alone: a summary per partition
        and one float each."""
        if self._group.size == 1:
            return own, None
        smallest = np.inf
        if batch is not None and len(batch["priority"]):
            smallest = float((batch["priority"] / batch["draw_mass"]).min())
        size = self._summary_spec.nbytes
        block = np.concatenate(
            [*(answer[:size] for answer in answers), np.array([smallest]).view(np.uint8)]
        )
        summaries, probabilities = [], []
        gathered = self._group.exchange(block)
        self._exchange_bytes = sum(b.nbytes for b in gathered)
        for learner_block in gathered:
            probabilities.append(learner_block[-8:].view(np.float64)[0])
            for start in range(0, len(learner_block) - 8, size):
                summaries.append(self._summary_spec.views(learner_block[start : start + size]))
        return summaries, float(min(probabilities))

    def _on_mesh(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        """The batch as the update takes it: with several learners, each one's rows are its
        block of the global array."""
        if not self._global_batch:
            return batch
        return {name: to_global(self._row_sharding, v) for name, v in batch.items()}

    def _train(
        self,
        batch: dict[str, np.ndarray],
        counts: np.ndarray,
        total_rows: int,
        smallest_probability: float | None,
    ) -> dict[str, Any]:
        """One update on this learner's `counts` rows of its partitions (`total_rows` over
        every learner's)."""
        algo = self._algo
        if algo.prioritized:
            progress = min(1.0, self.updates / self.num_updates)
            beta = algo.priority_beta + (1.0 - algo.priority_beta) * progress
            weights = importance_weights(
                batch["priority"],
                batch["draw_mass"],
                self._counter("size"),
                beta,
                smallest_probability,
            )
        else:
            weights = np.ones(len(batch["reward"]), np.float32)
        device_batch = {name: batch[name] for name in BATCH_FIELDS} | {"weight": weights}
        tick = time.perf_counter()
        self.state, metrics, td_errors = self._update(self.state, self._on_mesh(device_batch))
        td_errors = local_rows(td_errors)
        self._update_s += time.perf_counter() - tick
        self.trained += total_rows
        self.updates += 1
        if not np.all(np.isfinite(td_errors)):
            # Metrics are fetched only every log_interval; fetch them now to name the term.
            check_finite(
                self.updates,
                {k: float(v) for k, v in jax.device_get(metrics).items()} | {"td_error": np.nan},
            )
        if algo.prioritized:
            offset = 0
            for i, count in enumerate(counts):  # this learner's own partitions
                fields = self._priority_spec.views(self._priorities)
                fields["count"][0] = count
                rows = slice(offset, offset + count)
                fields["slot"][:count] = batch["slot"][rows]
                fields["generation"][:count] = batch["generation"][rows]
                fields["td_error"][:count] = td_errors[rows]
                if count:
                    self._channel.send_priorities(i, self._priorities)
                offset += count
        if self.updates % algo.param_broadcast_interval == 0:
            self._broadcast()
        stop_at = self.config.run.stop_at_return
        self.done = (self.env_steps >= self.config.run.total_env_steps) or (
            stop_at is not None
            and len(self._returns) == self.config.run.return_window
            and self.episode_return_mean >= stop_at
        )
        if self.updates % algo.log_interval and not self.done:
            return {}
        record = self._record({k: float(v) for k, v in jax.device_get(metrics).items()})
        if self._writer is not None:
            self._writer.write(record)
        if self._progress is not None:
            self._progress.update(record, force=self.done)
        return record

    def _record(self, metrics: dict[str, float]) -> dict[str, Any]:
        inserted = self._counter("inserted")
        record = {
            **progress_fields(self, self._start_time, self._lengths),
            "policy_lag_mean": 0.0,
            "replay/size": self._counter("size"),
            "replay/inserted": inserted,
            "replay/restored": self._counter("restored"),
            "replay/sampled": self.sampled,
            "replay/samples_per_insert": self.sampled / max(inserted, 1),
            "replay/partition_mass": self._masses.tolist(),
            "replay/stale_priority_updates": self._counter("stale_priority_updates"),
            # Bytes gathered from every learner per round (summaries only; 0 with one learner).
            "replay/learner_exchange_bytes": self._exchange_bytes,
            **metrics,
            "time/learner_wait_s": self._wait_s,
            "time/learner_update_s": self._update_s,
            "time/actor_env_step_s": float(self._actor_seconds[:, 0].mean()),
            "time/actor_inference_s": float(self._actor_seconds[:, 1].mean()),
            "time/actor_serving_s": float(self._actor_seconds[:, 2].mean()),
        }
        self.last_record = record
        return record

    def request_stop(self) -> None:
        if self._save_replay_at is None:
            self._channel.request_stop()
        else:
            self._channel.request_stop(save_replay_at=self._save_replay_at)
            self._save_replay_at = None

    def finish(self) -> ReplayAccounting:
        reports, late_answers = self._channel.collect_final_reports(
            self.config.run.transport_timeout_s
        )
        prefetched = sum(int(self._answer_spec.views(a)["count"][0]) for _, a in late_answers)
        reports, prefetched = gather_final_reports(self._group, reports, prefetched)
        self.accounting = ReplayAccounting.from_reports(
            reports, received=self.sampled, trained=self.trained, prefetched=prefetched
        )
        self.env_rank_usage = env_rank_usage(reports)
        if self._progress is not None:
            self._progress.close()
        return self.accounting
