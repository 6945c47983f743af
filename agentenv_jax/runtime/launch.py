"""Run an experiment: pick the run shape, agree on the experience spec, drive the loops.

`train(config)` is the one entry point for the CLI, notebooks and tests. A run has one of three
shapes: one learner and one env rank interleaved in this process over the in-process
transport (no launcher); one role per rank over MPI (`mpiexec`/`srun`); or `env.backend: jax`,
the envs inside the learner's jitted update in one process. Each builds its learner and
session its own way, then the same driver (`_drive`) runs them: the start event and config,
rounds until the session stops, the final checkpoint and the summary. What the run folder
holds, and whether it can resume, is `checkpoint.run_folder`'s to say.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentenv_jax.checkpoint import run_folder
from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import config_to_dict, save_config
from agentenv_jax.config.schema import ExperimentConfig
from agentenv_jax.config.sizes import check_memory
from agentenv_jax.learner.devices import learner_devices
from agentenv_jax.metrics.compilation import CompileTotals, compile_totals, use_persistent_cache
from agentenv_jax.metrics.summary import describe_topology, write_summary
from agentenv_jax.runtime.doctor import jax_devices, runtime_record
from agentenv_jax.runtime.policies import env_rank_leaf_paths, env_rank_uses_jax
from agentenv_jax.runtime.roles import (
    plan_for,
    prepare_env_rank,
    single_threaded_xla,
)
from agentenv_jax.transport.launcher import launched_by_mpi
from agentenv_jax.transport.topology import Topology, make_topology


class StartupError(RuntimeError):
    """A rank could not start (bad env, device count, ...); every rank raises the same message."""


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a finished run leaves for its caller (lead rank; other ranks get `run_dir` None)."""

    run_dir: Path | None
    updates: int
    env_steps: int
    episode_return_mean: float
    wall_s: float
    accounting: dict[str, Any] | None
    params: Any = None  # final parameters (host pytree) on the learner
    interrupted: bool = False  # stopped early by SIGTERM/SIGINT (a final checkpoint was written)


def _made_run_dir(config: ExperimentConfig) -> Path:
    """RUN_DIR of a named run, made if missing."""
    path = run_folder.folder_of(config)
    path.mkdir(parents=True, exist_ok=True)
    return path


# The run folder this process trains into, locked from the learner's checks to the end of
# `train` (the lead learner's process holds it).
_run_folder_locks: list[run_folder.RunFolderLock] = []


def _prepare_learner(
    config: ExperimentConfig, resume: bool, lead: bool = True
) -> tuple[ExperimentConfig, tuple[int, int] | None]:
    """The learner's checks before anything is written: no other job uses the run folder (the
    lead takes its lock), which is free (a new run) or resumable with this config (a resume).
    Returns the config with its run name decided and, for a resume, the saved replay set to load
    back. A config whose batch (or JAX envs) cannot fit in memory is refused first."""
    from agentenv_jax.metrics.logger import require_tensorboard_writer
    from agentenv_jax.metrics.wandb_logger import require_wandb

    check_memory(config, learner=True)
    if config.run.tensorboard:
        require_tensorboard_writer()
    if config.run.wandb:
        require_wandb()
    config = run_folder.with_run_name(config)
    if lead:
        path = run_folder.folder_of(config)
        if not resume or path.is_dir():  # a resume of no folder is refused below
            _run_folder_locks.append(run_folder.lock_run_folder(path))
    run_folder.check_new_run(config, resume)
    if not resume:
        return config, None
    run_folder.check_resumable(config, _made_run_dir(config))
    return config, _saved_replay(config)


def _learner_outputs(config: ExperimentConfig):
    """The run folder's metrics writer and the progress line. `config.yaml` is written only
    once the learner has restored its checkpoint and every rank has started, so a refused
    resume leaves the run's own config as it was."""
    from agentenv_jax.metrics.logger import MetricsWriter, ProgressLine
    from agentenv_jax.metrics.wandb_logger import wandb_logger_for

    run_dir = _made_run_dir(config)
    tensorboard_dir = run_dir / "tensorboard" if config.run.tensorboard else None
    wandb = wandb_logger_for(config, run_dir)
    writer = MetricsWriter(run_dir / "metrics.jsonl", tensorboard_dir, wandb)
    progress = ProgressLine(
        config.run.total_env_steps, config.run.progress, config.run.progress_interval_s
    )
    return run_dir, writer, progress


def _start_compile_clock(config: ExperimentConfig) -> CompileTotals:
    """Before anything compiles: open the run's persistent compilation cache, if it has one,
    and note this process's compilation so far."""
    use_persistent_cache(config.run.compilation_cache, config.run.compilation_cache_dir)
    return compile_totals()


def _summarize(
    run_dir: Path,
    learner,
    started: float,
    topology: str,
    compile_start: CompileTotals,
    interrupted: bool = False,
    processes: dict[int, dict[str, Any]] | None = None,
) -> TrainResult:
    """The session's summary (`metrics.summary.write_summary`), and its result for the caller."""
    summary = write_summary(
        run_dir, learner, started, topology, compile_start, interrupted, processes
    )
    return TrainResult(
        run_dir,
        learner.updates,
        learner.env_steps,
        learner.episode_return_mean,
        summary["wall_s"],
        summary["accounting"],
        learner.params(),
        interrupted,
    )


def _agree(world: Any, error: str | None) -> None:
    """Every rank says whether its part could start; if any could not, every rank raises the
    same error, so no rank is left waiting for a peer."""
    failures = [(rank, e) for rank, e in enumerate(world.allgather(error)) if e is not None]
    if failures:
        rank, message = failures[0]
        raise StartupError(f"rank {rank}: {message}")


def _saved_replay(config: ExperimentConfig) -> tuple[int, int] | None:
    """Where a resumed run's partitions come from (learner side; see `saved_replay_to_restore`),
    with a note when `checkpoint.save_replay` is on but there is nothing whole to load."""
    source = run_folder.saved_replay_to_restore(config, _made_run_dir(config))
    if source is None and config.checkpoint.save_replay:
        print(
            "agentenv: note: the newest checkpoint has no complete saved replay set; "
            "the partitions start empty",
            file=sys.stderr,
            flush=True,
        )
    return source


def _describe(err: BaseException) -> str:
    if isinstance(err, ConfigError | ValueError):
        return str(err)
    return f"{type(err).__name__}: {err}"  # an env constructor can raise anything


@dataclasses.dataclass(frozen=True)
class _RunShape:
    """What differs between the run shapes once the learner and its session are built."""

    mpi: bool  # ranks talk over MPI (the start event's runtime record)
    round: Callable[[], None]  # one round of work: the learner's, and an in-process env rank's
    stop: Callable[[], None]  # after the session's last round: end the learner (and env rank)
    topology: Callable[[], str]  # the summary's topology line, once the run has ended
    processes: dict[int, dict[str, Any]]  # the job's processes, for the start event
    lead: bool = True  # writes config.yaml, the start event and the summary


def _drive(
    config: ExperimentConfig,
    learner: Any,
    session: Any,
    run_dir: Path,
    writer: Any,
    shape: _RunShape,
    started: float,
    compile_start: CompileTotals,
) -> TrainResult:
    """The learner's part of every run shape: record the start, write config.yaml (only now,
    so a refused resume leaves the run's own config as it was), run rounds until the session
    stops, end, write the final checkpoint and the summary."""
    try:
        if shape.lead:
            session.record_start(shape.processes, runtime_record(mpi=shape.mpi))
            save_config(config, run_dir / "config.yaml")
        session.install_signal_handlers()
        learner.start()
        while session.running:
            shape.round()
            session.after_round()
        session.before_stop()
        try:
            shape.stop()
        finally:
            session.close()  # the final checkpoint, with the run's accounting when complete
        if not shape.lead:
            return TrainResult(
                None,
                learner.updates,
                learner.env_steps,
                learner.episode_return_mean,
                time.perf_counter() - started,
                learner.accounting.as_dict(),
                interrupted=session.interrupted,
            )
        return _summarize(
            run_dir,
            learner,
            started,
            shape.topology(),
            compile_start,
            session.interrupted,
            shape.processes if shape.mpi else None,
        )
    finally:
        if writer is not None:
            writer.close()
        session.restore_signal_handlers()


def _open_session(
    make_learner: Callable[[], Any],
    config: ExperimentConfig,
    run_dir: Path,
    resume: bool,
    writer: Any,
    group: Any = None,
) -> tuple[Any, Any]:
    """The learner and its session (which restores a resumed run's checkpoint); the writer is
    closed if either cannot be built."""
    from agentenv_jax.learner.session import LearnerSession

    try:
        learner = make_learner()
        return learner, LearnerSession(learner, config, run_dir, resume, group)
    except BaseException:
        if writer is not None:
            writer.close()
        raise


def run_single_process(config: ExperimentConfig, resume: bool = False) -> TrainResult:
    """One learner and one env rank in this process, interleaved over the in-process transport."""
    compile_start = _start_compile_clock(config)
    topology = make_topology(config, world_size=1, rank=0)
    config, replay_source = _prepare_learner(config, resume)
    vector_env, spaces = prepare_env_rank(config, topology)
    try:
        num_devices = learner_devices(config)
        plan = plan_for(config, topology, spaces, replay_source)
    except Exception:
        vector_env.close()
        raise
    transport = plan.make_inprocess()
    actor = plan.make_actor(vector_env, transport.actor)
    run_dir, writer, progress = _learner_outputs(config)
    started = time.perf_counter()
    learner, session = _open_session(
        lambda: plan.make_learner(transport.learner, num_devices, writer, progress),
        config,
        run_dir,
        resume,
        writer,
    )

    def one_round() -> None:
        # The env rank runs until it would have to wait for the learner, then the learner
        # takes one round: the same loops as under MPI, interleaved.
        while actor.ready():
            actor.run_once()
        learner.run_once()

    def stop() -> None:
        learner.request_stop()
        actor.run_once()
        actor.finish()
        learner.finish()

    shape = _RunShape(
        mpi=False,
        round=one_round,
        stop=stop,
        topology=lambda: describe_topology(topology, learner),
        processes=_this_process(),
    )
    return _drive(config, learner, session, run_dir, writer, shape, started, compile_start)


def _join_learners(config: ExperimentConfig, world: Any, topology: Any):
    """With several learner processes: split off their communicator (every rank takes part)
    and agree on the run's folder name. Returns the config and this learner's group (None on
    env ranks and with one learner)."""
    if not topology.multi_learner:
        return config, None
    from agentenv_jax.transport.mpi.learners import split_learner_group

    group = split_learner_group(world, topology.num_learner_ranks)
    if group is not None:
        name = run_folder.with_run_name(config).run.name
        config = run_folder.with_run_name(config, group.allgather(name)[0])
    return config, group


def _start_jax_runtime(config: ExperimentConfig, group: Any) -> None:
    """Learners of a multi-learner job: JAX's distributed runtime among them, from the
    coordinator address they agree on (before anything touches a JAX backend)."""
    from agentenv_jax.parallel.distributed import start_distributed

    requested = config.topology.learner_devices
    start_distributed(
        group.coordinator_address(config.run.transport_timeout_s),
        group.size,
        group.index,
        list(range(requested)) if requested else None,
        config.run.transport_timeout_s,
    )


def _this_process() -> dict[int, dict[str, Any]]:
    """A one-process run's only rank: its PID, host and JAX devices."""
    return {0: {"pid": os.getpid(), "host": socket.gethostname(), "jax_devices": jax_devices()}}


def _leaf_paths(config: ExperimentConfig, spaces: Any) -> Any:
    """The lead learner's `env_rank_leaf_paths` for the env ranks, or None where it cannot be
    built (the learner's own plan then fails and names why)."""
    try:
        return env_rank_leaf_paths(config, spaces)
    except Exception:
        return None


def _check_learner_devices(outcomes: list[dict[str, Any]], learners: int) -> None:
    counts = [o["devices"] for o in outcomes[:learners]]
    if len(set(counts)) > 1:
        raise StartupError(
            f"learners put different device counts in the mesh ({counts}, in rank order): "
            "set topology.learner_devices to a count every learner host has"
        )


def _broadcasts_params(
    config: ExperimentConfig, topology: Topology, processes: dict[int, dict], rank: int
) -> bool:
    """Whether the parameter group of `rank`'s learner broadcasts (`topology.param_sync`):
    under auto, when some of its env ranks run on another host than the learner. Every rank
    of a group decides alike, from the same start-up data."""
    if config.topology.param_sync != "auto":
        return config.topology.param_sync == "broadcast"
    learner = topology.learner_of_rank(rank)
    members = [r for r in processes if topology.learner_of_rank(r) == learner]
    return len({processes[r]["host"] for r in members}) > 1


def run_mpi(config: ExperimentConfig, resume: bool = False) -> TrainResult:
    """This rank's part of an MPI job (learner or env rank)."""
    from agentenv_jax.learner.session import STOP_SIGNALS, LearnerSession
    from agentenv_jax.transport.mpi import MPIWorld

    world = MPIWorld()
    if world.size == 1:
        return run_single_process(config, resume)
    # Each rank's host first: which learner an env rank feeds (and so its envs) depends on it.
    topology = make_topology(config, world.size, world.rank, world.allgather(socket.gethostname()))
    # An env rank opens JAX's compilation cache only once it knows it will compile (below):
    # one that acts in numpy never imports JAX.
    compile_start = _start_compile_clock(config) if topology.is_learner else None
    config, group = _join_learners(config, world, topology)
    lead = topology.is_lead
    if topology.is_env_rank:
        if config.topology.single_threaded_env_ranks:
            single_threaded_xla()
        # Preemption, Ctrl-C and hang-ups reach every rank; the learner decides when to stop.
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    vector_env = spaces = replay_source = num_devices = None
    error = None
    try:
        if topology.is_env_rank:
            vector_env, spaces = prepare_env_rank(config, topology)
        else:
            if group is not None:
                _start_jax_runtime(config, group)
            num_devices = learner_devices(config, topology.num_learner_ranks)
            config, replay_source = _prepare_learner(config, resume, lead)
    except Exception as err:
        error = _describe(err)
    outcomes = world.allgather(
        {
            "error": error,
            "spaces": spaces,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "run_name": config.run.name,
            "replay_source": replay_source,  # learner: saved partitions a resume loads back
            "devices": num_devices,  # learner: its devices in the mesh
            "jax_devices": None if topology.is_env_rank else jax_devices(),
        }
    )
    if any(o["error"] is not None for o in outcomes) and vector_env is not None:
        vector_env.close()
    failures = [(rank, o["error"]) for rank, o in enumerate(outcomes) if o["error"] is not None]
    if failures:
        raise StartupError(f"rank {failures[0][0]}: {failures[0][1]}")
    _check_learner_devices(outcomes, topology.num_learner_ranks)
    learner_outcome = outcomes[0]
    config = run_folder.with_run_name(config, learner_outcome["run_name"])
    spaces = outcomes[topology.num_learner_ranks]["spaces"]
    processes = {rank: {"pid": o["pid"], "host": o["host"]} for rank, o in enumerate(outcomes)}
    for rank in range(topology.num_learner_ranks):
        processes[rank]["jax_devices"] = outcomes[rank]["jax_devices"]
    world.watch_for_failed_ranks(processes)
    if config.topology.param_sync != "point_to_point":
        world.split_param_groups(
            topology.learner_of_rank(world.rank),
            broadcast=_broadcasts_params(config, topology, processes, world.rank),
        )
    leaf_paths = world.broadcast_from_lead(_leaf_paths(config, spaces) if world.rank == 0 else None)
    if topology.is_env_rank and env_rank_uses_jax(config, spaces, leaf_paths):
        use_persistent_cache(config.run.compilation_cache, config.run.compilation_cache_dir)
    plan = plan_for(config, topology, spaces, learner_outcome["replay_source"], leaf_paths)

    # Second agreement: building the roles can fail too (a checkpoint that does not fit).
    started = time.perf_counter()
    error = None
    learner = session = actor = channel = writer = None
    try:
        if topology.is_learner:
            channel = plan.make_mpi_learner_channel(world)
            if lead:
                run_dir, writer, progress = _learner_outputs(config)
            else:  # learner 0 alone writes metrics and the summary
                run_dir, progress = _made_run_dir(config), None
            learner = plan.make_learner(channel, num_devices, writer, progress, group)
            session = LearnerSession(learner, config, run_dir, resume, group)
        else:
            channel = plan.make_mpi_actor_channel(world)
            actor = plan.make_actor(vector_env, channel)
    except Exception as err:
        error = _describe(err)
    try:
        _agree(world, error)
    except StartupError:
        if channel is not None:
            channel.abandon()
        if session is not None:
            session.store.close()
        if topology.is_env_rank and actor is None:
            vector_env.close()  # an actor closes it at its end; this one never began
        raise

    if topology.is_learner:

        def stop() -> None:
            learner.request_stop()
            learner.finish()

        shape = _RunShape(
            mpi=True,
            round=learner.run_once,
            stop=stop,
            topology=lambda: describe_topology(topology, learner),
            processes=processes,
            lead=lead,
        )
        return _drive(config, learner, session, run_dir, writer, shape, started, compile_start)

    while actor.run_once():
        pass
    report = actor.finish()
    return TrainResult(
        None, 0, report["produced"], float("nan"), time.perf_counter() - started, None
    )


def run_jax_backend(config: ExperimentConfig, resume: bool = False) -> TrainResult:
    """`env.backend: jax` in this one process: the envs step inside the learner's jitted update
    (`learner.anakin`); no env ranks, no transport. Same run folder, metrics and checkpoints."""
    from agentenv_jax.learner.anakin_loop import AnakinLearner, prepare_anakin

    compile_start = _start_compile_clock(config)
    config, _ = _prepare_learner(config, resume)
    anakin = prepare_anakin(config)
    run_dir, writer, progress = _learner_outputs(config)
    started = time.perf_counter()
    learner, session = _open_session(
        lambda: AnakinLearner(config, anakin, writer, progress), config, run_dir, resume, writer
    )

    def topology() -> str:
        devices = len(learner.mesh.devices.flat)
        return f"1 process, {config.env.global_num_envs} JAX envs on {devices} device(s)"

    shape = _RunShape(
        mpi=False,
        round=learner.run_once,
        stop=learner.finish,
        topology=topology,
        processes=_this_process(),
    )
    return _drive(config, learner, session, run_dir, writer, shape, started, compile_start)


def _require_one_rank_for_jax_envs() -> None:
    """Under a launcher, `env.backend: jax` is an error on every rank unless the job is one rank."""
    from agentenv_jax.transport.mpi import MPIWorld

    size = MPIWorld().size
    if size > 1:
        raise ConfigError(
            f"env.backend = 'jax' is not allowed with {size} MPI ranks: it runs in one process "
            "(the envs step inside the learner's jit; there are no env ranks). Start it without "
            "mpiexec/srun (or with one rank), or set env.backend = 'gymnasium'"
        )


def train(config: ExperimentConfig, resume: bool = False) -> TrainResult:
    """Train as configured: over MPI when started by a launcher, else in this one process;
    `env.backend: jax` always in one process.

    With `resume`, the learner continues from the newest checkpoint in the config's run
    directory (counters, metrics file and all). No other job may be training into that
    directory meanwhile (`checkpoint.run_folder`)."""
    try:
        if config.env.backend == "jax":
            if launched_by_mpi():
                _require_one_rank_for_jax_envs()
            return run_jax_backend(config, resume)
        if launched_by_mpi():
            return run_mpi(config, resume)
        return run_single_process(config, resume)
    finally:
        while _run_folder_locks:
            _run_folder_locks.pop().release()


def abort_job(exit_code: int) -> None:
    """Under MPI with several ranks, stop every rank now; otherwise do nothing."""
    if not launched_by_mpi():
        return
    from agentenv_jax.transport.mpi import MPIWorld

    world = MPIWorld()
    if world.size > 1:
        world.abort(exit_code)


# How long a learner whose collective failed waits for the launcher to end the job before it
# says so itself: a dead peer's supervisor names it and the launcher ends the job within a
# second or two (docs/cluster.md).
_COLLECTIVE_FAILURE_GRACE_S = 10.0


def abort_on_unexpected_error(exc: BaseException) -> None:
    """Under MPI, an unexpected error on one rank must not leave the others waiting: print it
    with the rank and abort the whole job.

    A failed cross-process collective is the echo of a peer learner that ended, which its
    supervisor reports in one line: this rank waits quietly for the launcher to end the job,
    and only if it goes on says in one line what failed."""
    if not launched_by_mpi():
        return
    from agentenv_jax.parallel.distributed import is_collective_failure
    from agentenv_jax.transport.mpi import MPIWorld

    world = MPIWorld()
    if world.size > 1:
        if is_collective_failure(exc):
            time.sleep(_COLLECTIVE_FAILURE_GRACE_S)
            first_line = str(exc).strip().splitlines()[0]
            text = f"agentenv: error: rank {world.rank}: a collective between learners failed: "
            print(text + first_line, file=sys.stderr, flush=True)
        else:
            text = "".join(traceback.format_exception(exc))
            print(f"[rank {world.rank}] {text}", file=sys.stderr, flush=True)
        world.abort(1)


__all__ = ["StartupError", "TrainResult", "config_to_dict", "train"]
