"""`scaling_model.py`'s jobs: its workers (that script again, alone or under `mpiexec`) and
part B's training runs, each clocked with the load other processes put on the machine
meanwhile."""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import common
from scaling_update import CONFIG, rollout_length
from scaling_workers import RESULT_PREFIX

SCRIPT = str(Path(__file__).with_name("scaling_model.py"))
SLOW_ENV = "agentenv_jax.envs.slow:slow_cartpole"
STEADY_FROM = 3  # part B: rounds of updates >= this are the steady ones (1: compile, 2: ramp)


def _machine_cpu_s() -> float:
    """CPU seconds all processes of this machine have used since boot (/proc/stat: user, nice,
    system, irq, softirq, steal; nan where there is no /proc/stat)."""
    try:
        ticks = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return math.nan
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def launch_job(
    command: list[str], label: str, timeout: float, xla_devices: int | None = None
) -> tuple[str, float]:
    """Run `command` in this environment without a launcher's variables, with an empty
    compilation cache of its own (removed afterwards) and `xla_devices` host devices per process
    (None: XLA's default, one). Its stdout, and the cores other processes of the machine kept
    busy meanwhile (the machine's CPU seconds less the command's, per wall second): these
    benchmarks assume a quiet machine."""
    with common.job_environment() as env:
        env.pop("XLA_FLAGS", None)
        if xla_devices is not None:
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={xla_devices}"
        machine, children, started = _machine_cpu_s(), _children_cpu_s(), time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    others = (_machine_cpu_s() - machine) - (_children_cpu_s() - children)
    others_cores = max(0.0, others / (time.perf_counter() - started))
    if done.returncode != 0:
        output = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        raise SystemExit(f"{label} failed (exit {done.returncode}):\n{output}")
    return done.stdout, others_cores


def run_part(
    part: str, args: argparse.Namespace, ranks: int, xla_devices: int | None = None
) -> list[dict]:
    """`scaling_model.py` as a worker (`--worker --part PART`, with the options it was given),
    under `mpiexec -n ranks` when > 1; its results, each with the other processes' load
    (`others_cores`, see `launch_job`)."""
    command = common.script_command(SCRIPT, ["--worker", *sys.argv[1:]])
    command += ["--part", part, "--processes", str(ranks)]
    if ranks > 1:
        command = common.under_mpiexec(ranks, command)
    stdout, others = launch_job(command, f"worker {part} x{ranks}", args.job_timeout, xla_devices)
    results = common.results_in(stdout, RESULT_PREFIX)
    if not results:
        raise SystemExit(f"worker {part} printed no result:\n{stdout[-3000:]}")
    return [result | {"others_cores": others} for result in results]


def train(
    env_ranks: int,
    step_ms: float,
    updates: int,
    args: argparse.Namespace,
    root: Path,
    name: str,
    learners: int = 1,
) -> dict[str, Any]:
    """`mpiexec -n learners+env_ranks agentenv train cartpole_ppo` on the slow env with
    `--envs-per-rank` envs per env rank for `updates` updates (each learner on one CPU device);
    its summary and the medians of its steady rounds' timings (rounds of updates >=
    STEADY_FROM; a round is the wall-clock between two updates)."""
    t_len = rollout_length()
    global_envs = args.envs_per_rank * env_ranks
    settings = [
        f"env.id={SLOW_ENV}",
        f"env.kwargs={{step_s: {step_ms / 1000}}}",
        f"env.global_num_envs={global_envs}",
        *common.run_settings(
            root,
            name,
            total_env_steps=updates * t_len * global_envs,
            transport_timeout_s=args.timeout,
        ),
        "checkpoint.on_exit=false",
        f"topology.num_learner_ranks={learners}",
    ]
    command = common.under_mpiexec(learners + env_ranks, common.train_command(CONFIG, settings))
    started = time.perf_counter()
    _, others_cores = launch_job(command, name, args.job_timeout)
    job_s = time.perf_counter() - started
    run_dir = root / name
    summary = json.loads((run_dir / "summary.json").read_text())
    records = common.read_jsonl(run_dir / "timings.jsonl")
    shutil.rmtree(run_dir, ignore_errors=True)
    steady = [
        (record, record["wall_s"] - before["wall_s"])
        for before, record in zip(records[:-1], records[1:], strict=True)
        if record["update"] >= STEADY_FROM
    ]
    timings = {
        key: common.median([r[key] for r, _ in steady])
        for key in (
            "time/learner_wait_s",
            "time/learner_update_s",
            "time/actor_env_step_s",
            "time/actor_inference_s",
            "time/actor_transport_wait_s",
        )
    }
    timings["round_s"] = common.median([round_s for _, round_s in steady])
    timings["learner_rest_s"] = common.median(
        [round_s - r["time/learner_wait_s"] - r["time/learner_update_s"] for r, round_s in steady]
    )
    timings["rest_s"] = common.median(
        [
            round_s
            - r["time/actor_env_step_s"]
            - r["time/actor_inference_s"]
            - r["time/learner_update_s"]
            for r, round_s in steady
        ]
    )
    return {
        "learners": learners,
        "env_ranks": env_ranks,
        "envs": global_envs,
        "rows": t_len * global_envs,
        "rollout_length": t_len,
        "updates": summary["updates"],
        "steps_per_s": summary["steps_per_s_after_first_update"],
        "session_steps_per_s": summary["steps_per_s"],
        "env_rank_cpu_share": common.median(summary.get("env_rank_cpu_share") or []),
        "job_s": job_s,
        "others_cores": others_cores,
        **timings,
    }
