"""The learner loop: gather a round of segments, run the sharded PPO update, broadcast parameters.

The maths is in `algorithms.ppo`; data placement in `parallel.mesh`; this module wires them to a
`LearnerChannel`, keeps the global normalizer statistics, and writes metrics.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from agentenv_jax.algorithms.ppo import (
    TrainState,
)
from agentenv_jax.buffers.frame_stacks import restacked_rollout, stacked_obs_field
from agentenv_jax.buffers.segment_queue import ACTOR_TIMERS, segment_counts
from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.schema import ExperimentConfig
from agentenv_jax.envs import normalization as norm
from agentenv_jax.envs.factory import EnvSpaces
from agentenv_jax.envs.text.padding import (
    generation_utilisation,
    trim_text_rollout,
    trimmed_lengths,
    update_padding_fraction,
)
from agentenv_jax.learner.ahead_of_time import CompiledAhead
from agentenv_jax.learner.group_refill import informative_mask, refilled_rollout
from agentenv_jax.learner.guards import check_finite
from agentenv_jax.learner.on_policy_model import (
    gradient_data_axis,
    num_updates,
    on_policy_model,
)
from agentenv_jax.learner.text_training import token_ppo_hyperparams
from agentenv_jax.metrics.accounting import Accounting, reconcile
from agentenv_jax.metrics.episode_window import EpisodeWindow
from agentenv_jax.metrics.logger import (
    MetricsWriter,
    ProgressLine,
    SteadyRate,
    progress_fields,
)
from agentenv_jax.metrics.process_usage import env_rank_usage
from agentenv_jax.metrics.text import TextCounters
from agentenv_jax.networks.flat_params import FlatLayout
from agentenv_jax.networks.packing import PACKED_FIELDS, PACKED_ROW_AXES, packed_minibatches
from agentenv_jax.parallel.mesh import (
    BATCH_AXIS,
    env_axis_sharding,
    make_mesh,
    place_on_mesh,
    replicated,
    row_constraint,
    spans_processes,
    to_global,
)
from agentenv_jax.parallel.partitioning import check_model_axis_divides, state_shardings
from agentenv_jax.transport.base import (
    LearnerChannel,
    LearnerGroup,
    SoloLearnerGroup,
    gather_final_reports,
)
from agentenv_jax.transport.spec import MessageSpec

# Fields of a segment that form the `[T, B, ...]` rollout the update consumes.
ROLLOUT_FIELDS = (
    "obs",
    "action",
    "reward",
    "log_prob",
    "value",
    "bootstrap_value",
    "terminated",
    "truncated",
    "valid",
)
# A text env's rollouts also carry each message's token count: 0 where the step's message
# was not a move (a seat whose game ended on another seat's move), whose tokens are not trained.
TEXT_ROLLOUT_FIELDS = (*ROLLOUT_FIELDS, "response_tokens")
# Per-env fields `[B, ...]` that come with each rollout.
ROLLOUT_LAST_FIELDS = ("last_value", "last_obs")
# Fields of a segment every learner reads from every env rank (with several learners, they
# exchange them each round): normalizer statistics, episodes, policy versions, counts.
SUMMARY_FIELDS = (
    "episode_return",
    "episode_length",
    "policy_version",
    "valid",
    "obs_stats",
    "return_stats",
    "actor_seconds",
    "env_faults",
)


# Text envs' segments add these to the summary: tokens generated, episode outcomes, and the
# values of named reward functions (tasks that have them).
TEXT_SUMMARY_FIELDS = ("response_tokens", "episode_success", "reward_terms", "reward_failed")


def summary_spec(segment_spec: MessageSpec) -> MessageSpec:
    """The layout of a segment's summary (`SUMMARY_FIELDS`, and a text env's)."""
    names = [f.name for f in segment_spec.fields]
    extra = [name for name in TEXT_SUMMARY_FIELDS if name in names]
    return MessageSpec([segment_spec[name] for name in (*SUMMARY_FIELDS, *extra)])


def rollout_fields(text: bool) -> tuple[str, ...]:
    """The `[T, B]` fields of a rollout: a text env's add the messages' token counts."""
    return TEXT_ROLLOUT_FIELDS if text else ROLLOUT_FIELDS


def rollout_shapes(segment_specs: list[MessageSpec]) -> dict[str, jax.ShapeDtypeStruct]:
    """The rollout `run_once` assembles from one segment of each spec: `[T, B, ...]` fields
    joined along the env axis, `[B, ...]` ones along the first."""
    text = "response_tokens" in [f.name for f in segment_specs[0].fields]

    def joined(name: str, axis: int) -> jax.ShapeDtypeStruct:
        fields = [
            stacked_obs_field(spec) if name == "obs" else spec[name] for spec in segment_specs
        ]
        shape = list(fields[0].shape)
        shape[axis] = sum(field.shape[axis] for field in fields)
        return jax.ShapeDtypeStruct(tuple(shape), fields[0].dtype)

    return {name: joined(name, 1) for name in rollout_fields(text)} | {
        name: joined(name, 0) for name in ROLLOUT_LAST_FIELDS
    }


def rollout_shardings(mesh: Mesh, text: bool = False, packed: bool = False) -> dict[str, Any]:
    """Each rollout field's sharding (a text env's with `text`): the env axis split over the
    mesh; a packed update's rows (`packed`) split over its batch axis, their indices whole."""
    return (
        {name: env_axis_sharding(mesh, 2) for name in rollout_fields(text)}
        | {name: env_axis_sharding(mesh, 1) for name in ROLLOUT_LAST_FIELDS}
        | {name: _packed_sharding(mesh, name) for name in (PACKED_FIELDS if packed else ())}
    )


def _packed_sharding(mesh: Mesh, name: str) -> NamedSharding:
    if name not in PACKED_ROW_AXES:
        return replicated(mesh)
    return NamedSharding(mesh, PartitionSpec(*[None] * PACKED_ROW_AXES[name], BATCH_AXIS))


def jit_sharded_update(
    update: Callable,
    mesh: Mesh,
    state_sharding: Any = None,
    data_axis: str | None = None,
    text: bool = False,
    packed: bool = False,
) -> Callable:
    """Jit `update(state, rollout)` with the rollout's env axis sharded over `mesh` and the
    train state as `state_sharding` (`state_shardings`; replicated by default); the state
    argument is donated (updated in place). With `data_axis`, `update` is one shard's part
    (`make_ppo_update`), mapped over the mesh with `shard_map`: each device runs it on its
    block of envs, the state replicated."""
    state_sharding = replicated(mesh) if state_sharding is None else state_sharding
    if data_axis is not None:
        specs = {name: s.spec for name, s in rollout_shardings(mesh, text).items()}
        update = jax.shard_map(
            update,
            mesh=mesh,
            in_specs=(PartitionSpec(), specs),
            out_specs=(PartitionSpec(), PartitionSpec()),
            # Unchecked: with the check, JAX would sum each gradient leaf over the shards on
            # its own (the transpose of using replicated parameters with sharded rows); here
            # a shard's gradients stay its own until the update's one psum adds them.
            check_vma=False,
        )
    return jax.jit(
        update,
        in_shardings=(state_sharding, rollout_shardings(mesh, text, packed)),
        out_shardings=(state_sharding, replicated(mesh)),
        donate_argnums=(0,),
    )


def _merge_flat_stats(total: norm.RunningStats, flat: np.ndarray) -> norm.RunningStats:
    return norm.merge_stats(total, norm.stats_from_flat(flat, total.mean.shape[0]))


def initial_state(model: Any, mesh: Any, shardings: Any, init_key: jax.Array, train_key: jax.Array):
    """The first train state of `model` (an `OnPolicyModel`) laid out with `shardings`: the
    host parameters go straight to their shards (a device receives only its part of a matrix
    sharded over `model`), and the state built from them (reference copy, optimizer moments)
    is made in place, sharded: no device ever holds the whole model."""
    param_shardings = getattr(shardings, "params", shardings)  # one sharding on a 1-D mesh
    params = place_on_mesh(mesh, model.init_params(init_key), param_shardings)
    return jax.jit(model.train_state, out_shardings=shardings)(params, train_key)


class Learner:
    """Owns the train state on a device mesh; drives PPO or IMPALA over a `LearnerChannel`.

    Update k consumes the k-th segment of every env rank (one round); env ranks bound how far
    ahead of it they run (`max_policy_lag`), so lag is bounded and runs are reproducible.

    With several learner processes (`group`), each receives the segments of its own env ranks
    (`segment_specs`) and contributes them as its block of the global rollout; the learners
    exchange every segment's summary (`peer_segment_specs`: each learner's segment layouts), so
    normalizers, episode window, counts and the stop decision are the same on all of them.
    """

    def __init__(
        self,
        config: ExperimentConfig,
        spaces: EnvSpaces,
        channel: LearnerChannel,
        segment_specs: list[MessageSpec],
        param_spec: MessageSpec,
        num_devices: int,
        writer: MetricsWriter | None,
        progress: ProgressLine | None,
        group: LearnerGroup | None = None,
        peer_segment_specs: list[list[MessageSpec]] | None = None,
        make_inference_server: Callable[[LearnerChannel, jax.Device], Any] | None = None,
    ):
        self.config = config
        self._channel = channel
        self._segment_specs = segment_specs
        self._group = group or SoloLearnerGroup()
        peers = peer_segment_specs or [segment_specs]
        self._summary_specs = [[summary_spec(spec) for spec in specs] for specs in peers]
        self._param_spec = param_spec
        self._writer = writer
        self._progress = progress
        self.num_updates = num_updates(config, spaces.agents)

        self.mesh = make_mesh(num_devices, model=config.topology.model_axis)
        data_axis = gradient_data_axis(config, spaces, self.mesh)
        model = on_policy_model(
            config, spaces, self.num_updates, row_constraint(self.mesh), data_axis
        )
        abstract_state = jax.eval_shape(
            model.train_state, model.param_shapes, jax.ShapeDtypeStruct((2,), jnp.uint32)
        )
        check_model_axis_divides(abstract_state.params, config.topology.model_axis)
        self._state_sharding = state_shardings(self.mesh, abstract_state)
        # Sequence packing (`algorithm.packed_row_length`): minibatches chosen and packed here.
        self._packed_row_length = (
            getattr(config.algorithm, "packed_row_length", 0) if spaces.text else 0
        )
        if self._packed_row_length and spans_processes(self.mesh):
            raise ConfigError(
                f"algorithm.packed_row_length = {self._packed_row_length}: packed minibatches "
                "are packed by one learner process (its devices split the rows), and this "
                "run's learner mesh spans several; run one learner process, or set "
                "packed_row_length = 0"
            )
        jitted_update = jit_sharded_update(
            model.update,
            self.mesh,
            self._state_sharding,
            data_axis,
            spaces.text is not None,
            bool(self._packed_row_length),
        )
        # Text updates trimmed of padding (`algorithm.length_bucket`) take the shapes each
        # round's messages need, compiled as they first occur; the rest have one shape, which
        # compiles while the parameters are initialized and the first rollout is collected.
        self._length_bucket = getattr(config.algorithm, "length_bucket", 0) if spaces.text else 0
        self._pad_id = spaces.text.pad_id if spaces.text else 0
        refill_rounds = getattr(config.algorithm, "refill_rounds", 0) if spaces.text else 0
        self._eos_id = spaces.text.eos_id if spaces.text else 0
        self._refill_hyperparams = (
            token_ppo_hyperparams(config.algorithm, spaces.text) if refill_rounds else None
        )
        self._update = (
            jitted_update
            if self._length_bucket or self._packed_row_length
            else CompiledAhead(
                jitted_update,
                abstract_state,
                rollout_shapes([spec for specs in peers for spec in specs]),
            )
        )
        self._global_batch = spans_processes(self.mesh)
        self._rollout_shardings = rollout_shardings(self.mesh, spaces.text is not None)
        init_key, train_key = jax.random.split(jax.random.PRNGKey(config.run.seed))
        self.state = initial_state(model, self.mesh, self._state_sharding, init_key, train_key)
        # Env ranks take one flat vector: gathered whole, however the parameters are sharded.
        self._ravel = jax.jit(
            FlatLayout(self.state.params).ravel, out_shardings=replicated(self.mesh)
        )
        self._obs_stats = norm.empty_stats(spaces.normalizer_dim)
        self._return_stats = norm.empty_stats(1)
        self._param_message = param_spec.allocate()
        self._episodes = EpisodeWindow(config.run.return_window, spaces.agents)
        self.episodes = 0
        self._env_faults: list[int] = []
        # What earlier sessions of this run (before a resume) accounted for.
        self._before = Accounting()
        self.received = 0  # this session's rows, counted as segments arrive
        self.trained = 0  # this session's rows, counted by the update
        self.updates = 0
        self.rounds = 0  # rounds of segments taken (with refill_rounds, several per update)
        self.discarded = 0  # this session's rows left out of refilled updates
        self.done = False
        self.accounting: Accounting | None = None
        # Per env rank, at the end: CPU share, peak memory, JAX loaded (`env_rank_usage`).
        self.env_rank_usage: dict[str, list] | None = None
        # With env.normalize_obs: the statistics each env rank normalized with at the end.
        self.env_rank_obs_normalizer: list[dict[str, Any]] | None = None
        self.env_rank_policy_params: list[int] | None = None  # per env rank, at the end
        self._start_time = time.perf_counter()
        self.last_record: dict[str, Any] = {}
        self.steady_rate = SteadyRate()  # steps/s once the first update has compiled
        self.text = (
            TextCounters(config.run.return_window, spaces.text.reward_names)
            if spaces.text is not None
            else None
        )
        # Central inference (`topology.inference: learner`): this learner acts for its env
        # ranks on one of its own devices.
        self.inference_device = self.mesh.local_mesh.devices.flat[0]
        self._computed_s = 0.0  # the server's compute seconds at the last record
        self.inference = (
            None
            if make_inference_server is None
            else make_inference_server(channel, self.inference_device)
        )

    @property
    def env_faults(self) -> int:
        """Env faults survived so far (envs re-created), over all env ranks."""
        return sum(self._env_faults)

    @property
    def env_steps(self) -> int:
        """Transitions trained on over the whole run, earlier sessions included."""
        return self._before.trained + self.trained

    @property
    def session_env_steps(self) -> int:
        """Transitions trained on since this process started (or resumed) the run."""
        return self.trained

    @property
    def obs_stats(self) -> norm.RunningStats:
        """The global observation statistics, merged from every env rank's segments."""
        return self._obs_stats

    @property
    def version(self) -> int:
        """The parameters' version env ranks see: the rounds taken so far (one per update,
        unless dynamic sampling refills)."""
        return self.rounds

    @property
    def episode_return_mean(self) -> float:
        """The mean return of the episode window; in a multi-agent env, the team return."""
        return self._episodes.return_mean

    def params(self) -> Any:
        """The current parameters as a host pytree."""
        return jax.device_get(self.state.params)

    def checkpoint_saved(self, update: int) -> None:
        """Nothing to add to a checkpoint: on-policy segments live for one update."""

    def checkpoint_meta(self) -> dict[str, Any]:
        """Everything besides `state` a resumed run needs to continue where this one is."""
        so_far = self.accounting or self._before + Accounting.trained_so_far(
            self.trained, self.discarded
        )
        return {
            "updates": self.updates,
            "rounds": self.rounds,
            "trained": self.env_steps,
            "accounting": so_far.counts(),
            "episodes": self.episodes,
            **self._episodes.state(),
            "obs_stats": norm.stats_to_flat(self._obs_stats).tolist(),
            "return_stats": norm.stats_to_flat(self._return_stats).tolist(),
            **({"text": self.text.state()} if self.text is not None else {}),
        }

    def restore(self, state: TrainState, meta: dict[str, Any]) -> None:
        """Continue from a checkpoint: the state and the counters go on from where they were."""
        self.state = jax.device_put(state, self._state_sharding)
        self.updates, self.episodes = int(meta["updates"]), int(meta["episodes"])
        self.rounds = int(meta.get("rounds", self.updates))
        self._before = (
            Accounting(**meta["accounting"])
            if "accounting" in meta
            else Accounting.trained_so_far(int(meta["trained"]))
        )
        self._episodes.load(meta)
        if self.text is not None and "text" in meta:
            self.text.load(meta["text"])
        self._obs_stats = _merge_flat_stats(self._obs_stats, np.asarray(meta["obs_stats"]))
        self._return_stats = _merge_flat_stats(self._return_stats, np.asarray(meta["return_stats"]))
        self.done = self.updates >= self.num_updates

    def start(self) -> None:
        """Broadcast the current version so env ranks can start collecting."""
        self._start_time = time.perf_counter()
        self._broadcast()
        if self.inference is not None:
            self.inference.start()

    def _broadcast(self) -> None:
        fields = self._param_spec.views(self._param_message)
        fields["version"][0] = self.version
        flat = self._ravel(self.state.params)
        if self.inference is not None:
            # The server's copy, on its device (checked there: no host copy); env ranks get no
            # parameters.
            local = jax.device_put(flat.addressable_shards[0].data, self.inference_device)
            check_finite(self.updates, {}, local)
            self.inference.set_params(local)
        else:
            fields["params"][:] = np.asarray(flat)
            check_finite(self.updates, {}, fields["params"])
        fields["obs_stats"][:] = norm.stats_to_flat(self._obs_stats)
        fields["return_stats"][:] = norm.stats_to_flat(self._return_stats)
        self._channel.broadcast_params(self._param_message)

    def run_once(self) -> dict[str, Any]:
        """One synchronous round: receive, update, broadcast (unless the run is over). With
        `algorithm.refill_rounds`, more rounds under the same parameters until the update's
        groups all teach something (or the rounds are spent)."""
        wait_s = 0.0
        rounds, informative, lags, actor_seconds, counts = [], [], [], [], []
        taught = 0  # informative groups over the rounds so far
        while True:
            tick = time.perf_counter()
            rollout, lag, seconds, row_counts = self._receive_round()
            wait_s += time.perf_counter() - tick
            rounds.append(rollout)
            counts.append(row_counts)
            lags.append(lag)
            actor_seconds.append(seconds)
            if self._refill_hyperparams is None:
                break
            informative.append(informative_mask(rollout, self._eos_id, self._refill_hyperparams))
            taught += int(informative[-1].sum())
            missing = rollout["reward"].size // self._refill_hyperparams.group_size - taught
            # Every learner process takes the same rounds: env ranks wait on one version.
            if len(rounds) > self.config.algorithm.refill_rounds or not self._group.any(
                missing > 0
            ):
                break
            self._channel.release_round()
            self._broadcast()  # the same parameters, a new version: the next round may start
        lag = np.concatenate(lags)
        actor_seconds = np.sum(actor_seconds, axis=0)
        refill = {}
        if self._refill_hyperparams is not None:
            rollout, left = refilled_rollout(
                rounds, informative, self._refill_hyperparams.group_size, ROLLOUT_LAST_FIELDS
            )
            local = [
                sum(int(c[name][rows].sum()) for c, rows in zip(counts, left, strict=True))
                for name in ("rows", "tokens", "episodes")
            ] + [taught]
            gathered = np.sum(self._group.allgather(local), axis=0).tolist()
            rows, tokens, episodes, groups = gathered
            self.discarded += rows
            if self.text is not None:
                self.text.discarded_tokens += tokens
                self.text.discarded_episodes += episodes
            refill = {
                "refill_rounds": len(rounds) - 1,
                "groups_informative": groups,  # over the rounds, kept or not
                "rows_discarded": rows,
            }
        trained_columns = {}
        if self._length_bucket:
            lengths = self._trimmed_lengths(rollout)
            rollout = trim_text_rollout(rollout, lengths)
            context_length, response_length = lengths
            trained_columns = {
                "trained_context_length": context_length,
                "trained_response_length": response_length,
            }
        if self._packed_row_length:
            rollout |= self._packed_minibatches(rollout)
        if self.text is not None:
            trained_columns |= self._padding_measures(rounds, rollout)
        if self._global_batch:
            rollout = {
                name: to_global(self._rollout_shardings[name], value)
                for name, value in rollout.items()
            }
        self._channel.release_round()

        tick = time.perf_counter()
        with self._during_update():
            self.state, metrics = self._update(self.state, rollout)
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        update_s = time.perf_counter() - tick
        self.trained += int(metrics.pop("trained_rows"))
        if self.text is not None:
            self.text.trained_tokens += int(metrics.pop("trained_tokens"))
        self.updates += 1
        check_finite(self.updates, metrics)

        record = {
            **progress_fields(self, self._start_time, self._episodes.lengths),
            **self._agent_returns(),
            **(self.text.record(self._start_time) if self.text is not None else {}),
            "policy_lag_mean": float(lag.mean()) if lag.size else 0.0,
            "policy_lag_max": int(lag.max()) if lag.size else 0,
            "policy_lag_hist": np.bincount(lag).tolist() if lag.size else [],
            "env_faults": self.env_faults,
            **metrics,
            **refill,
            **trained_columns,
            "time/learner_wait_s": wait_s,
            "time/learner_update_s": update_s,
            **self._generate_time(),
            **{
                f"time/actor_{name}": float(v)
                for name, v in zip(ACTOR_TIMERS, actor_seconds, strict=True)
            },
        }
        self.last_record = record
        self.done = self.updates >= self.num_updates or self._episodes.reached(
            self.config.run.stop_at_return
        )
        if not self.done:
            self._broadcast()
        if self._writer is not None:
            self._writer.write(record)
        if self._progress is not None:
            self._progress.update(record, force=self.done)
        return record

    def _receive_round(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, dict]:
        """One round of segments, every env rank's, as a `[T, B, ...]` rollout (a copy: the
        round's buffers may be released), with what their summaries carry taken in: normalizer
        statistics, episodes, counts. Returns it, the policy lag of its valid rows, the env
        ranks' mean actor seconds, and what each of this learner's rows counts for (valid
        rows, tokens, episode ends: `[T, B]` each, with refill_rounds, else empty)."""
        serve = None
        if self.inference is not None:
            # A serving thread answers by itself: waiting, the learner only checks on it.
            serve = self.inference.check if self.inference.threaded else self.inference.serve
        buffers = self._channel.receive_round(self.config.run.transport_timeout_s, serve=serve)
        self.rounds += 1
        segments = [spec.views(buf) for spec, buf in zip(self._segment_specs, buffers, strict=True)]
        rollout = {
            name: np.concatenate([s[name] for s in segments], axis=1)
            for name in TEXT_ROLLOUT_FIELDS
            if name in segments[0]
        }
        if "obs" not in rollout:  # frames, stacked again here (`buffers.frame_stacks`)
            rollout["obs"] = restacked_rollout(segments)
        for name in ROLLOUT_LAST_FIELDS:
            rollout[name] = np.concatenate([s[name] for s in segments])
        summaries = self._round_summaries(segments)
        versions = np.concatenate([s["policy_version"] for s in summaries], axis=1)
        actor_seconds = np.mean([s["actor_seconds"] for s in summaries], axis=0)
        self._env_faults = [int(s["env_faults"][0]) for s in summaries]
        for s in summaries:
            self._obs_stats = _merge_flat_stats(self._obs_stats, s["obs_stats"])
            self._return_stats = _merge_flat_stats(self._return_stats, s["return_stats"])
            self.episodes += self._episodes.add(s["episode_return"], s["episode_length"])
            self.received += int(s["valid"].sum())
            if self.text is not None:
                self.text.receive(s)
        valid = np.concatenate([s["valid"] for s in summaries], axis=1).astype(bool)
        # The version the round was collected against is the rounds taken before it.
        lag = (self.rounds - 1 - versions)[valid]
        if self.text is not None:  # each token's own (a partial rollout's answers span several)
            self.text.token_versions(
                self.rounds - 1,
                np.concatenate([s["token_version"] for s in segments], axis=1),
                rollout["valid"].astype(bool),
            )
        counts = {}
        if self._refill_hyperparams is not None:
            local_valid = rollout["valid"].astype(bool)
            counts = {
                "rows": local_valid,
                "tokens": np.concatenate([s["response_tokens"] for s in segments], 1) * local_valid,
                "episodes": np.concatenate(
                    [np.isfinite(s["episode_return"]) for s in segments], axis=1
                ),
            }
        return rollout, lag, actor_seconds, counts

    def _during_update(self) -> contextlib.AbstractContextManager:
        """Central inference: what the server answers while the update runs is counted."""
        if self.inference is None:
            return contextlib.nullcontext()
        return self.inference.during_update()

    def _generate_time(self) -> dict[str, float]:
        """Central inference: the seconds the server computed since the last record (while
        the learner waited, or on its thread also while it updated)."""
        if self.inference is None:
            return {}
        computed = self.inference.compute_s
        since, self._computed_s = computed - self._computed_s, computed
        return {"time/learner_generate_s": since}

    def _packed_minibatches(self, rollout: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """This update's minibatches, each packed into rows of `packed_row_length` tokens
        (`networks.packing.packed_minibatches`); the order drawn from the run's seed and the
        update's number, so a resumed run draws what it would have."""
        algo = self.config.algorithm
        rows = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731  as the update flattens
        return packed_minibatches(
            rows(rollout["obs"]),
            rows(rollout["action"]),
            rows(rollout["valid"]) > 0,
            self._pad_id,
            self._eos_id,
            self._packed_row_length,
            algo.num_epochs,
            algo.num_minibatches,
            np.random.default_rng([self.config.run.seed, self.updates]),
            row_multiple=self.mesh.shape[BATCH_AXIS],
        )

    def _padding_measures(
        self, rounds: list[dict[str, np.ndarray]], rollout: dict[str, np.ndarray]
    ) -> dict[str, float]:
        """How much of what this update's rounds generated, and of what its update computes,
        was needed (`envs.text.padding`): generation as each env rank's batches ran it."""
        widths = np.cumsum([0, *(spec["action"].shape[1] for spec in self._segment_specs)])
        needed, computed = generation_utilisation(
            [
                (r["action"][:, a:b], r["valid"][:, a:b])
                for r in rounds
                for a, b in zip(widths[:-1], widths[1:], strict=True)
            ],
            self._eos_id,
            self._pad_id,
            self.config.network.language_model.generation_slots,
        )
        measures = {
            "generation_utilisation": needed / computed if computed else 1.0,
            "update_padding_fraction": update_padding_fraction(
                rollout["obs"], rollout["action"], rollout["valid"], self._pad_id, self._eos_id
            ),
        }
        if "packed_segments" in rollout:  # the gradient steps' rows, packed
            segments = rollout["packed_segments"]
            measures["packed_padding_fraction"] = 1.0 - np.count_nonzero(segments) / segments.size
        return measures

    def _trimmed_lengths(self, rollout: dict[str, np.ndarray]) -> tuple[int, int]:
        """The lengths this round's messages need; with several learner processes the longest
        of theirs, so that every process runs the update of the same shapes."""
        lengths = trimmed_lengths(
            rollout["obs"], rollout["action"], self._pad_id, self._length_bucket
        )
        if self._global_batch:
            everyone = multihost_utils.process_allgather(np.asarray(lengths, np.int32))
            lengths = tuple(int(n) for n in np.asarray(everyone).reshape(-1, 2).max(axis=0))
        return lengths

    def _round_summaries(self, segments: list[dict[str, np.ndarray]]) -> list[dict[str, Any]]:
        """Every env rank's segment summary this round, learner-major (with one learner: the
        segments themselves)."""
        if self._group.size == 1:
            return segments
        local = np.concatenate(
            [
                spec.pack({f.name: segment[f.name] for f in spec.fields})
                for spec, segment in zip(
                    self._summary_specs[self._group.index], segments, strict=True
                )
            ]
        )
        summaries = []
        for specs, block in zip(self._summary_specs, self._group.exchange(local), strict=True):
            bounds = np.cumsum([0, *(spec.nbytes for spec in specs)])
            summaries += [
                spec.views(block[a:b])
                for spec, a, b in zip(specs, bounds[:-1], bounds[1:], strict=True)
            ]
        return summaries

    def _agent_returns(self) -> dict[str, float]:
        """Multi-agent envs: the mean agent return beside the team return."""
        if self._episodes.agents == 1:
            return {}
        return {"agent_return_mean": self._episodes.agent_return_mean}

    def request_stop(self) -> None:
        self._channel.request_stop()

    def finish(self) -> Accounting:
        """Collect env ranks' final reports and reconcile the experience accounting of the
        whole run (this session added to the earlier ones)."""
        reports, late_segments = self._channel.collect_final_reports(
            self.config.run.transport_timeout_s
        )
        late_counts = [
            segment_counts(self._segment_specs[i].views(buf)) for i, buf in late_segments
        ]
        late = sum(c[0] for c in late_counts)
        if self.text is not None:
            # Summed over learners like `late`: each holds only its own env ranks' segments.
            gathered = self._group.allgather(
                [sum(c[1] for c in late_counts), sum(c[2] for c in late_counts)]
            )
            self.text.late_tokens += sum(g[0] for g in gathered)
            self.text.late_episodes += sum(g[1] for g in gathered)
        reports, late = gather_final_reports(self._group, reports, late)
        self.accounting = self._before + reconcile(
            reports,
            received=self.received,
            trained=self.trained,
            late=late,
            discarded=self.discarded,
        )
        if self.text is not None:
            self.text.reconcile(reports)
        self.env_rank_usage = env_rank_usage(reports)
        if self.inference is not None:
            self.inference.close()
        self.env_rank_policy_params = [int(r.get("policy_params", -1)) for r in reports]
        if all("obs_normalizer" in r for r in reports):
            self.env_rank_obs_normalizer = [r["obs_normalizer"] for r in reports]
        if self._progress is not None:
            self._progress.close()
        return self.accounting
