"""Real Slurm, on the one-node cluster `.ci/start_slurm` starts (CI starts it before the tests):
`srun` steps whose ranks are killed or hang, `srun` without an MPI plugin, a generated `sbatch`
script preempted with `scancel --signal=TERM`, requeued and resumed, and a sweep as a job array.
Without a running Slurm these tests skip, except under CI, where they fail."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from agentenv_jax.metrics.logger import read_metrics

from conftest import (
    EXPERIMENTS,
    REPO,
    agentenv_command,
    mpiexec_path,
    processes_with,
    read_events,
    restorable_checkpoint,
    run_command,
    settings,
    signal_rank_and_wait,
    start_job,
    wait_for_records,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CARTPOLE = str(EXPERIMENTS / "cartpole_ppo.yaml")
# The node has fewer cores than a step has ranks; the mpich wheel speaks PMI-2.
SRUN = ["srun", "--overcommit", "--mpi=pmi2"]


@pytest.fixture(scope="module", autouse=True)
def slurm() -> None:
    """A Slurm that answers, with its node up."""
    sinfo = shutil.which("sinfo")
    states = ""
    if sinfo is not None:
        states = subprocess.run(
            [sinfo, "-h", "-o", "%T"], capture_output=True, text=True, timeout=30
        ).stdout
    if not re.search(r"^(idle|mixed|allocated)", states, re.M):
        if os.environ.get("CI") == "true":
            pytest.fail(f"no Slurm node is up (sinfo: {states!r}): .ci/run starts one")
        pytest.skip("no Slurm running here (as root, `bash .ci/start_slurm` starts one)")


def _job_state(job: str) -> str:
    shown = subprocess.run(
        ["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30
    ).stdout
    found = re.search(r"JobState=(\w+)", shown)
    return found.group(1) if found else "GONE"


def _wait_for_state(job: str, states: tuple[str, ...], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while (state := _job_state(job)) not in states:
        assert time.monotonic() < deadline, f"job {job} is still {state} after {timeout} s"
        time.sleep(0.5)
    return state


def _sbatch(script: Path, cwd: Path) -> str:
    submitted = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, cwd=cwd, timeout=60
    )
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0]


def _cancel(job: str | None) -> None:
    if job is not None:
        subprocess.run(["scancel", job], timeout=30, check=False)


@pytest.mark.parametrize(
    "killed_rank, srun_flags",
    [(2, []), (0, []), (2, ["--kill-on-bad-exit"])],
    ids=["env-rank", "learner", "env-rank-kill-on-bad-exit"],
)
def test_a_killed_rank_ends_the_srun_step_within_seconds(tmp_path, killed_rank, srun_flags):
    """Slurm ends a step when one task dies only with -K; without it, the dead rank's
    supervisor ends the step. Either way the rank is named, the step is gone within 10 s (the
    transport timeout is 60 s), no process is left, and the start event says what ran it."""
    run_dir = tmp_path / "kill"
    proc = start_job(
        [
            *SRUN,
            *srun_flags,
            "-n",
            "3",
            *agentenv_command("train", CARTPOLE),
            *settings(
                f"run.run_dir={tmp_path}",
                "run.name=kill",
                "checkpoint.every_updates=5",
                "run.transport_timeout_s=60",
            ),
        ]
    )
    ended = signal_rank_and_wait(proc, run_dir, killed_rank, after_updates=12)
    assert proc.returncode != 0
    assert ended.ended_after < 10, (ended.ended_after, ended.stderr[-3000:])
    named = f"rank {killed_rank} (pid {ended.pid}) was killed by SIGKILL"
    assert named in ended.stderr, ended.stderr[-3000:]
    assert processes_with(str(tmp_path)) == []
    start = ended.start
    assert start["runtime"]["launcher"] == "srun" and start["runtime"]["pmi"] == "PMI-2"
    assert re.fullmatch(r"\d+\.\d+", start["runtime"]["slurm_step"])
    assert start["runtime"]["mpi_library"].startswith("MPICH")
    assert start["processes"]["0"]["jax_devices"]["platform"] == "cpu"
    assert restorable_checkpoint(run_dir) >= 5


def test_mpiexec_inside_a_slurm_step_ends_its_job_and_leaves_the_step_alone(tmp_path):
    """`mpiexec` run from the shell of an interactive step (`srun --pty bash`): its ranks carry
    that step's variables, but the step is the user's shell, not theirs. A killed rank ends the
    mpiexec job (MPICH does), and the shell goes on."""
    run_dir = tmp_path / "inner"
    job = shlex.join(
        [
            mpiexec_path(),
            "-launcher",
            "fork",  # on this node, as from an interactive shell
            "-n",
            "3",
            *agentenv_command("train", CARTPOLE),
            *settings(f"run.run_dir={tmp_path}", "run.name=inner", "run.transport_timeout_s=60"),
        ]
    )
    proc = start_job(
        ["srun", "--overcommit", "-n", "1", "bash", "-c", f'{job}; echo "the shell goes on: $?"']
    )
    ended = signal_rank_and_wait(proc, run_dir, 2, after_updates=12)
    assert ended.ended_after < 10, ended.stderr[-3000:]
    assert "rank 2 (pid" in ended.stderr and "was killed by SIGKILL" in ended.stderr
    assert "the shell goes on: " in ended.stdout, (ended.stdout + ended.stderr)[-3000:]
    assert ended.start["runtime"]["launcher"] == "mpiexec (Hydra)"
    assert processes_with(str(tmp_path)) == []


def test_a_hung_rank_ends_the_srun_step_after_the_transport_timeout(tmp_path):
    """An env rank that is alive but silent (SIGSTOP) is named by the learner once
    run.transport_timeout_s has passed, and its abort ends the whole step."""
    run_dir = tmp_path / "hung"
    proc = start_job(
        [
            *SRUN,
            "-n",
            "3",
            *agentenv_command("train", CARTPOLE),
            *settings(
                f"run.run_dir={tmp_path}",
                "run.name=hung",
                "run.transport_timeout_s=10",
                "run.progress=false",
            ),
        ]
    )
    ended = signal_rank_and_wait(proc, run_dir, 2, after_updates=8, signum=signal.SIGSTOP)
    assert proc.returncode != 0
    assert (
        "rank 0: timed out after 10 s waiting for a segment from env rank(s) 2 "
        "(run.transport_timeout_s)" in ended.stderr
    ), ended.stderr[-3000:]
    assert 9 < ended.ended_after < 40, ended.ended_after
    assert processes_with(str(tmp_path)) == []


def test_srun_without_an_mpi_plugin_is_one_error_not_three_runs(tmp_path):
    """Slurm's default `--mpi=none` hands MPICH no job: every task would train alone."""
    proc = run_command(
        [
            "srun",
            "--overcommit",
            "--mpi=none",
            "-n",
            "3",
            *agentenv_command("train", CARTPOLE, *settings(f"run.run_dir={tmp_path}")),
        ],
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode != 0
    assert proc.stderr.count("agentenv: error:") == 1, proc.stderr
    assert "srun started 3 ranks (PMI: none)" in proc.stderr
    assert "sees a world of 1" in proc.stderr and "--mpi=pmi2" in proc.stderr
    assert not any(tmp_path.iterdir())  # no run was started


def _wait_for_updates(run_dir: Path, job: str, count: int) -> None:
    """Until the job's run has written `count` metrics records in all."""

    def running() -> None:
        state = _job_state(job)
        assert state in ("PENDING", "CONFIGURING", "RUNNING"), f"job {job} is {state}"

    wait_for_records(run_dir, count, 180, running)


def _requeued(job: str) -> None:
    """Until a requeued job is pending: it starts again once its credential has expired
    (Reason=BeginTime; AuthInfo=cred_expire, 10 s in .ci/start_slurm)."""
    _wait_for_state(job, ("PENDING",), 60)


def _starts_and_stops(run_dir: Path) -> list[tuple[str, int]]:
    return [
        (e["event"], e["update"])
        for e in read_events(run_dir)
        if e["event"] in ("start", "resume", "interrupted")
    ]


def test_a_generated_sbatch_job_survives_its_time_limit_and_a_preemption(tmp_path):
    """The script `agentenv slurm` writes (its `--mpi` chosen for the mpich wheel), on a real
    Slurm: near its time limit (Slurm's USR1 to the batch shell) it stops the run with a
    checkpoint and requeues itself; the next start resumes; a preemption
    (`scancel --signal=TERM`) stops it with a checkpoint again; requeued, it resumes and runs
    to the end of the budget. The counters continue across the three starts, and the log keeps
    every start's output."""
    budget = 100_000
    written = run_command(
        agentenv_command(
            "slurm",
            "cartpole_ppo",
            "--gpus",
            "0",
            "--env-ranks",
            "2",
            "--time",
            "00:10:00",
            *settings(
                f"run.run_dir={tmp_path / 'runs'}",
                "run.name=job",
                f"run.total_env_steps={budget}",
                "checkpoint.every_updates=10",
            ),
        ),
        timeout=120,
        cwd=tmp_path,
    )
    assert written.returncode == 0, written.stderr
    assert "\nsrun --mpi=pmi2 " in (tmp_path / "job.sbatch").read_text()
    run_dir = tmp_path / "runs" / "job"
    job = None
    try:
        job = _sbatch(tmp_path / "job.sbatch", tmp_path)
        _wait_for_updates(run_dir, job, 15)
        # What Slurm does `grace` seconds before the time limit (--signal=B:USR1@grace).
        subprocess.run(["scancel", "--batch", "--signal=USR1", job], timeout=30, check=True)
        _requeued(job)
        _wait_for_updates(run_dir, job, len(read_metrics(run_dir / "metrics.jsonl")) + 15)
        first_stop = [u for e, u in _starts_and_stops(run_dir) if e == "interrupted"]
        assert len(first_stop) == 1, _starts_and_stops(run_dir)
        assert ("resume", first_stop[0]) in _starts_and_stops(run_dir)

        subprocess.run(["scancel", "--signal=TERM", job], timeout=30, check=True)  # preemption
        assert _wait_for_state(job, ("COMPLETED", "FAILED", "CANCELLED"), 120) == "COMPLETED"
        (_, second_stop) = [x for x in _starts_and_stops(run_dir) if x[0] == "interrupted"][1]
        assert restorable_checkpoint(run_dir) == second_stop
        assert json.loads((run_dir / "summary.json").read_text())["interrupted"]

        subprocess.run(["scontrol", "requeue", job], timeout=30, check=True)
        _requeued(job)
        assert _wait_for_state(job, ("COMPLETED", "FAILED", "CANCELLED"), 240) == "COMPLETED"
    finally:
        _cancel(job)
    assert _starts_and_stops(run_dir) == [
        ("start", 0),
        ("interrupted", first_stop[0]),
        ("start", first_stop[0]),
        ("resume", first_stop[0]),
        ("interrupted", second_stop),
        ("start", second_stop),
        ("resume", second_stop),
    ]
    updates = [r["update"] for r in read_metrics(run_dir / "metrics.jsonl")]
    assert updates == list(range(1, len(updates) + 1))  # one run: no update twice or missed
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= budget and not summary["interrupted"]
    assert summary["accounting"]["reconciles"]
    log = (tmp_path / "runs" / f"job.slurm-{job}.out").read_text()
    assert log.count("(reconciles)") == 3, log[-3000:]  # every start's closing summary


def test_a_sweep_runs_as_a_slurm_job_array(tmp_path):
    """`agentenv slurm SWEEP` writes a job array, one task per trial, each an `srun` job of
    the trial's ranks. One task nears its time limit: it stops its trial with a checkpoint
    and requeues itself, and its next start resumes the trial. When every task has ended,
    every trial has finished and the sweep's table holds them all."""
    sweep = tmp_path / "array.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "base": "cartpole_ppo",
                "name": "array",
                "run_dir": str(tmp_path / "runs"),
                "set": ["run.total_env_steps=60000", "run.progress=false"],
                "parameters": {"algorithm.clip_eps": [0.1, 0.2]},
                "ranks": 2,
                "parallel": 2,
            },
            sort_keys=False,
        )
    )
    written = run_command(
        agentenv_command("slurm", str(sweep), "--gpus", "0", "-o", "array.sh"),
        timeout=120,
        cwd=tmp_path,
    )
    assert written.returncode == 0, written.stderr
    script = (tmp_path / "array.sh").read_text()
    assert "#SBATCH --array=0-1%2" in script and "--launcher 'srun --mpi=pmi2'" in script
    folder = tmp_path / "runs" / "array"
    first = folder / "trials" / "c00-clip_eps=0.1-seed0"
    job = None
    try:
        job = _sbatch(tmp_path / "array.sh", tmp_path)
        _wait_for_updates(first, f"{job}_0", 15)
        subprocess.run(["scancel", "--batch", "--signal=USR1", f"{job}_0"], timeout=30, check=True)
        _requeued(f"{job}_0")
        # Each task by its own id: the array's listing may miss a task between its requeue
        # and its next start.
        for task in (f"{job}_0", f"{job}_1"):
            assert _wait_for_state(task, ("COMPLETED", "FAILED", "CANCELLED"), 300) == "COMPLETED"
    finally:
        _cancel(job)
    stops = _starts_and_stops(first)
    assert [e for e, _ in stops] == ["start", "interrupted", "start", "resume"], stops
    logs = sorted((folder / "logs").glob("slurm-*_*.out"))
    assert [p.name for p in logs] == [f"slurm-{job}_0.out", f"slurm-{job}_1.out"]
    for trial in ("c00-clip_eps=0.1-seed0", "c01-clip_eps=0.2-seed0"):
        summary = json.loads((folder / "trials" / trial / "summary.json").read_text())
        assert summary["topology"].startswith("1 learner + 1 env rank(s)")
        assert summary["env_steps"] >= 60_000 and summary["accounting"]["reconciles"]
        assert "srun --mpi=pmi2" in (folder / "logs" / f"{trial}.log").read_text()
    rows = (folder / "trials.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",finished" in row for row in rows[1:]), rows
