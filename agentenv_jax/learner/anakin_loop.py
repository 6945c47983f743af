"""The shell around the Anakin step (`env.backend: jax`): counters, the episode window, the
accounting and metrics records, and the `LearnerSession` protocol for checkpoints and resume.

The maths is in `learner.anakin` (and the algorithms it reuses); this module only calls the
jitted step once per update and reads its outputs back to the host.
"""

from __future__ import annotations

import time
from typing import Any

import jax

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.schema import ExperimentConfig
from agentenv_jax.envs.jax_envs import check_jax_backend_settings, make_jax_env
from agentenv_jax.learner.anakin import Anakin, AnakinState, build_anakin, state_shardings
from agentenv_jax.learner.guards import check_finite
from agentenv_jax.metrics.accounting import Accounting
from agentenv_jax.metrics.episode_window import EpisodeWindow
from agentenv_jax.metrics.logger import (
    MetricsWriter,
    ProgressLine,
    SteadyRate,
    progress_fields,
)

# On-policy algorithms whose update takes the `[T, E]` rollout the Anakin step produces. SAC
# keeps its replay partitions on env ranks, which this mode has none of.
SUPPORTED_ALGORITHMS = ("ppo", "impala")


def prepare_anakin(config: ExperimentConfig) -> Anakin:
    """Check the config for `env.backend: jax`, make the gymnax env and build the learner on the
    devices `topology.learner_devices` asks for. `ConfigError`, `EnvError` or `MeshError` say
    what does not fit."""
    from agentenv_jax.learner.devices import learner_devices

    if config.algorithm.name not in SUPPORTED_ALGORITHMS:
        raise ConfigError(
            f"algorithm.name = {config.algorithm.name!r} is not allowed with env.backend = "
            f"'jax': expected one of {', '.join(map(repr, SUPPORTED_ALGORITHMS))}"
        )
    check_jax_backend_settings(config.env)
    jax_env = make_jax_env(config.env)
    return build_anakin(config, jax_env, learner_devices(config))


class AnakinLearner:
    """Runs one jitted rollout-and-update per `run_once`; the envs live in `state`."""

    def __init__(
        self,
        config: ExperimentConfig,
        anakin: Anakin,
        writer: MetricsWriter | None,
        progress: ProgressLine | None,
    ):
        self.config = config
        self.mesh = anakin.mesh
        self.num_updates = anakin.num_updates
        self.state: AnakinState = anakin.state
        self._step = anakin.step
        self._writer = writer
        self._progress = progress
        self._rows_per_update = config.algorithm.rollout_length * config.env.global_num_envs
        self._episodes = EpisodeWindow(config.run.return_window)
        self.episodes = 0
        self._before = Accounting()  # what earlier sessions of this run (before a resume) did
        self.produced = 0  # this session's env steps, counted as each rollout is collected
        self.trained = 0  # this session's rows, counted by the update on the device
        self.updates = 0
        self.done = False
        self.accounting: Accounting | None = None
        self.env_faults = 0  # JAX envs cannot raise mid-step: nothing to re-create
        self._start_time = time.perf_counter()
        self.last_record: dict[str, Any] = {}
        self.steady_rate = SteadyRate()

    @property
    def env_steps(self) -> int:
        """Transitions trained on over the whole run, earlier sessions included."""
        return self._before.trained + self.trained

    @property
    def session_env_steps(self) -> int:
        return self.trained

    @property
    def episode_return_mean(self) -> float:
        return self._episodes.return_mean

    def params(self) -> Any:
        return jax.device_get(self.state.params)

    def _session_accounting(self) -> Accounting:
        # No transport between acting and learning: every row collected is handed to the update
        # in the same jitted call, so sent and received are the rows produced, by construction.
        p = self.produced
        return Accounting(produced=p, sent=p, received=p, trained=self.trained)

    def checkpoint_saved(self, update: int) -> None:
        """Nothing besides the state to save: the envs are part of it."""

    def checkpoint_meta(self) -> dict[str, Any]:
        so_far = self.accounting or self._before + self._session_accounting()
        return {
            "updates": self.updates,
            "trained": self.env_steps,
            "accounting": so_far.counts(),
            "episodes": self.episodes,
            **self._episodes.state(),
        }

    def restore(self, state: AnakinState, meta: dict[str, Any]) -> None:
        """Continue from a checkpoint: the state (envs mid-episode included) and the counters."""
        self.state = jax.device_put(state, state_shardings(self.mesh))
        self.updates, self.episodes = int(meta["updates"]), int(meta["episodes"])
        self._before = Accounting(**meta["accounting"])
        self._episodes.load(meta)
        self.done = self.updates >= self.num_updates

    def start(self) -> None:
        self._start_time = time.perf_counter()

    def run_once(self) -> dict[str, Any]:
        """One update: collect `T x E` steps and train on them, in one jitted call."""
        tick = time.perf_counter()
        self.state, outputs = self._step(self.state)
        outputs = jax.device_get(outputs)  # waits for the step
        update_s = time.perf_counter() - tick
        self.produced += self._rows_per_update
        metrics = {k: float(v) for k, v in outputs["metrics"].items()}
        self.trained += int(metrics.pop("trained_rows"))
        self.updates += 1
        check_finite(self.updates, metrics)
        # `[T, E]`, read in time order, so the window keeps the newest episodes.
        self.episodes += self._episodes.add(outputs["episode_return"], outputs["episode_length"])

        record = {
            **progress_fields(self, self._start_time, self._episodes.lengths),
            # Acting and learning share the parameters of one step: synchronous, lag 0.
            "policy_lag_mean": 0.0,
            "policy_lag_max": 0,
            **metrics,
            "time/learner_update_s": update_s,
        }
        self.last_record = record
        self.done = self.updates >= self.num_updates or self._episodes.reached(
            self.config.run.stop_at_return
        )
        if self._writer is not None:
            self._writer.write(record)
        if self._progress is not None:
            self._progress.update(record, force=self.done)
        return record

    def finish(self) -> Accounting:
        """The accounting of the whole run (this session added to the earlier ones)."""
        self.accounting = self._before + self._session_accounting()
        if self._progress is not None:
            self._progress.close()
        return self.accounting
