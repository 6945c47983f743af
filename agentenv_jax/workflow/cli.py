"""The `agentenv` command line: train, show a resolved config, print the config reference."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from agentenv_jax.config.errors import ConfigError, MeshError
from agentenv_jax.runtime import supervisor
from agentenv_jax.transport.launcher import LaunchError, launcher_rank


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentenv",
        description="Distributed actor-critic RL with JAX and MPI. Runs in one process, or one "
        "role per rank under mpiexec/srun.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train an agent from an experiment file")
    train.add_argument(
        "config",
        nargs="?",
        help="experiment YAML, or a shipped experiment's name (agentenv list); default: the "
        "built-in defaults",
    )
    train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its newest checkpoint, with its own "
        "config.yaml and any --set applied on top (no config file)",
    )
    train.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set algorithm.learning_rate=3e-4 (repeatable)",
    )
    show = commands.add_parser("show-config", help="print the resolved config as YAML")
    show.add_argument("config", nargs="?")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    commands.add_parser("config-reference", help="print the config reference (Markdown)")
    commands.add_parser(
        "doctor",
        help="say which launcher, PMI, MPI library and devices this process (or, under a "
        "launcher, every rank) gets",
    )
    commands.add_parser("list", help="list the shipped experiments (train one by its name)")
    evaluate = commands.add_parser(
        "eval", help="play a run's saved policy on fresh env seeds and report its return"
    )
    evaluate.add_argument("run_dir", metavar="RUN_DIR", help="the run folder")
    evaluate.add_argument("--episodes", type=int, default=10, help="episodes to play")
    evaluate.add_argument(
        "--checkpoint", type=int, metavar="K", help="the checkpoint of update K (default newest)"
    )
    evaluate.add_argument(
        "--sample", action="store_true", help="sample actions instead of taking the mode"
    )
    evaluate.add_argument("--seed", type=int, default=0, help="selects the evaluation env seeds")
    evaluate.add_argument(
        "--video",
        metavar="DIR",
        help="record each episode as an MP4 in DIR (envs that render rgb_array frames)",
    )
    evaluate.add_argument(
        "--pass-at",
        type=int,
        metavar="K",
        help="text envs: answer each of the --episodes problems K times (sampled) and report "
        "pass@K and the accuracy over all answers",
    )
    evaluate.add_argument(
        "--split",
        choices=["train", "test"],
        help="text tasks with a held-out split (reasoning_gym/<dataset>): the problems of "
        "this split (default the run's own; test is never trained on)",
    )
    evaluate.add_argument(
        "--dialogues",
        type=int,
        default=0,
        metavar="N",
        help="text envs: also print the first N episodes' dialogues",
    )
    export = commands.add_parser(
        "export",
        help="write a run's pretrained-model policy as a Hugging Face folder (transformers, "
        "vLLM, llama.cpp)",
    )
    export.add_argument("run_dir", metavar="RUN_DIR", help="the run folder")
    export.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write (new or empty)")
    export.add_argument(
        "--checkpoint", type=int, metavar="K", help="the checkpoint of update K (default newest)"
    )
    plot = commands.add_parser(
        "plot",
        help="draw learning curves (mean and band over seeds of one config) and time breakdowns",
    )
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders")
    plot.add_argument("--x", choices=["steps", "time"], default="steps", help="the x axis")
    plot.add_argument(
        "--metric",
        dest="metrics",
        action="append",
        metavar="NAME",
        help="a metrics.jsonl key to draw (repeatable; default episode_return_mean)",
    )
    plot.add_argument("-o", "--output", default="curves.png", help="the PNG to write")
    sweep = commands.add_parser(
        "sweep",
        help="run a sweep file's trials (grid or random, seeds as an axis), N at a time, "
        "resumably, and write its results tables",
    )
    sweep.add_argument("sweep", help="sweep YAML, or a shipped sweep's name (agentenv list)")
    sweep.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    sweep.add_argument("--parallel", type=int, help="trials at once (default: the file's)")
    sweep.add_argument(
        "--trial",
        type=int,
        metavar="K",
        help="run only trial K (0-based; a Slurm array task's SLURM_ARRAY_TASK_ID)",
    )
    sweep.add_argument(
        "--launcher",
        metavar="CMD",
        help="start each trial under CMD (e.g. 'srun --mpi=pmix') instead of mpiexec -n RANKS",
    )
    sweep.add_argument(
        "--table", action="store_true", help="only rewrite the results tables from the trials"
    )
    slurm = commands.add_parser(
        "slurm",
        help="write a Slurm batch script for a run (learner on a GPU node, env ranks on CPU "
        "nodes) or a job array for a sweep, resumed after preemption or requeue",
    )
    slurm.add_argument(
        "config",
        help="experiment YAML or shipped name (a new run), a run folder (resume), or a sweep "
        "file or shipped sweep (a job array, one task per trial)",
    )
    slurm.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    slurm.add_argument(
        "--env-ranks", type=int, help="env ranks (MPI tasks; default 8; a sweep: its ranks)"
    )
    slurm.add_argument(
        "--env-nodes", type=int, default=1, help="CPU nodes for the env ranks (a sweep: per task)"
    )
    slurm.add_argument("--gpus", type=int, default=1, help="learner GPUs (0: no GPU node)")
    slurm.add_argument("--cpus-per-env-rank", type=int, default=1)
    slurm.add_argument("--time", default="04:00:00", help="time limit per start of the job")
    slurm.add_argument("--gpu-partition")
    slurm.add_argument("--cpu-partition")
    slurm.add_argument("--account")
    slurm.add_argument(
        "--grace", type=int, default=120, help="seconds before the limit to stop and requeue"
    )
    slurm.add_argument(
        "--mpi",
        help="srun --mpi plugin (default: pmi2 for MPICH, pmix for Open MPI, by the MPI this "
        "environment has)",
    )
    slurm.add_argument("--parallel", type=int, help="sweep: array tasks at once (default: its)")
    slurm.add_argument("-o", "--output", help="the script to write (default: RUN_NAME.sbatch)")
    return parser


def resume_config(run_dir: str, config_path: str | None, overrides: list[str]):
    """The config of a resumed run: the run's own config.yaml plus overrides, pointed back at
    the same run directory. Another config file would silently become the run's: refused."""
    from pathlib import Path

    from agentenv_jax.checkpoint.run_folder import has_checkpoint
    from agentenv_jax.config.loading import load_config

    folder = Path(run_dir)
    if config_path is not None:
        raise ConfigError(
            f"--resume {run_dir!r} continues with the run's own config.yaml; a config file "
            f"({config_path!r}) is not allowed with it: give changes as --set KEY=VALUE"
        )
    if not has_checkpoint(folder):
        raise ConfigError(
            f"--resume {run_dir!r}: not a run directory with checkpoints "
            "(expected RUN_DIR/checkpoints from an earlier run)"
        )
    location = [f"run.run_dir={folder.resolve().parent}", f"run.name={folder.resolve().name}"]
    return load_config(folder / "config.yaml", [*overrides, *location])


def _requested_config(args: argparse.Namespace):
    """The config `train` or `show-config` asked for: a resumed run's own, else the file's."""
    resume = getattr(args, "resume", None)
    if resume is not None:
        return resume_config(resume, args.config, args.overrides)
    from agentenv_jax.config.loading import load_config

    return load_config(args.config, args.overrides)


def _sweep(args: argparse.Namespace) -> int:
    import shlex

    from agentenv_jax.workflow.sweeps.runner import SweepRunner, prepare, write_results
    from agentenv_jax.workflow.sweeps.spec import read_sweep

    spec = read_sweep(args.sweep, args.overrides, args.parallel)
    trials = prepare(spec)
    if args.table:
        write_results(spec, trials)
        print(f"wrote {spec.folder / 'results.md'}", flush=True)
        return 0
    only = None
    if args.trial is not None:
        if not 0 <= args.trial < len(trials):
            raise ConfigError(
                f"--trial {args.trial} is not allowed: sweep {spec.name!r} has trials 0 to "
                f"{len(trials) - 1}"
            )
        only = [trials[args.trial]]
    launcher = shlex.split(args.launcher) if args.launcher else ()
    runner = SweepRunner(spec, trials, lambda line: print(line, flush=True), launcher)
    return runner.run(only)


def _rank_prefix() -> str:
    rank = launcher_rank()
    return "" if rank is None else f"rank {rank}: "


def _is_lead_rank() -> bool:
    return launcher_rank() in (None, "0")


# How long the other ranks wait before exiting on an error every rank found, so that the lead's
# message is out first: Open MPI's mpirun (and srun -K) kill the job at the first non-zero exit.
_LEAD_SPEAKS_FIRST_S = 2.0


def _agreed_error(err: BaseException) -> int:
    """The exit of a rank on an error every rank sees alike: the lead rank says it once."""
    if _is_lead_rank():
        print(f"agentenv: error: {err}", file=sys.stderr, flush=True)
    else:
        time.sleep(_LEAD_SPEAKS_FIRST_S)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    if args.command == "train":
        from agentenv_jax.transport.launcher import launched_by_mpi

        try:
            under_launcher = launched_by_mpi()
        except ConfigError as err:
            return _agreed_error(err)
        if under_launcher and not supervisor.is_rank_process():
            return supervisor.supervise(argv)
        supervisor.die_with_supervisor()
    if args.command == "list":
        import shutil

        from agentenv_jax.config.experiments import (
            describe,
            format_listing,
            shipped_experiments,
            shipped_sweeps,
        )

        width = shutil.get_terminal_size((100, 24)).columns  # 100 when not a terminal
        experiments = {name: describe(path) for name, path in shipped_experiments().items()}
        print("\n".join(format_listing(experiments, width)))
        print("\nsweeps (agentenv sweep NAME):")
        sweeps = {name: describe(path) for name, path in shipped_sweeps().items()}
        print("\n".join(format_listing(sweeps, width)))
        return 0
    if args.command == "config-reference":
        from agentenv_jax.config.reference import config_reference

        print(config_reference())
        return 0

    config = None
    if args.command in ("train", "show-config"):
        # Read before JAX is imported: a rank that refuses a bad config exits within a second.
        try:
            config = _requested_config(args)
        except ConfigError as err:
            return _agreed_error(err)
        if args.command == "show-config":
            import yaml

            from agentenv_jax.config.loading import config_to_dict

            print(yaml.safe_dump(config_to_dict(config), sort_keys=False), end="")
            return 0

    from agentenv_jax.checkpoint.store import CheckpointError
    from agentenv_jax.envs.factory import EnvError
    from agentenv_jax.learner.guards import NonFiniteError
    from agentenv_jax.runtime.launch import (
        StartupError,
        abort_job,
        abort_on_unexpected_error,
        train,
    )
    from agentenv_jax.transport.base import TransportError

    try:
        if args.command == "doctor":
            from agentenv_jax.runtime.doctor import doctor

            return doctor()
        if args.command == "slurm":
            from agentenv_jax.workflow.slurm import write_job

            script = write_job(args)
            print(f"wrote {script}; submit it with: sbatch {script}", flush=True)
            return 0
        if args.command == "sweep":
            return _sweep(args)
        if args.command == "plot":
            from agentenv_jax.workflow.api import load_run
            from agentenv_jax.workflow.plotting import plot_runs

            runs = [load_run(path) for path in args.run_dirs]
            metrics = args.metrics or ["episode_return_mean"]
            print(plot_runs(runs, args.output, args.x, metrics), flush=True)
            return 0
        if args.command == "export":
            from agentenv_jax.workflow.export import export_run

            out = export_run(args.run_dir, args.out_dir, args.checkpoint)
            print(f"wrote {out}: load it with transformers.AutoModelForCausalLM.from_pretrained")
            return 0
        if args.command == "eval":
            from agentenv_jax.workflow.evaluation import evaluate

            result = evaluate(
                args.run_dir,
                args.episodes,
                args.checkpoint,
                not args.sample,
                args.seed,
                args.video,
                args.pass_at,
                args.split,
            )
            print(result.describe(), flush=True)
            if args.dialogues and result.dialogues is not None:
                print(result.dialogues.format(limit=args.dialogues), flush=True)
            return 0
        train(config, resume=getattr(args, "resume", None) is not None)
        # The run has ended and saved. A late copy of its stop request (Slurm signals each
        # process of a step as well as its parent) must not turn this clean exit into a kill.
        from agentenv_jax.learner.session import STOP_SIGNALS

        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    except (ConfigError, EnvError, MeshError, StartupError, CheckpointError, LaunchError) as err:
        return _agreed_error(err)  # every rank sees the same error; one message is enough
    except KeyboardInterrupt:
        return 130
    except (TransportError, NonFiniteError) as err:
        # A peer that stopped answering, or a diverged update: one clear line, then stop every
        # rank (the others may be waiting on this one).
        print(f"agentenv: error: {_rank_prefix()}{err}", file=sys.stderr, flush=True)
        abort_job(3)
        return 3
    except Exception as err:
        abort_on_unexpected_error(err)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
