"""Real Slurm, on the one-machine cluster `.ci/start_slurm` starts (CI starts it before the
tests; two nodes, one with a GPU that is /dev/null): `srun` steps whose ranks are killed or
hang, `srun` without an MPI plugin, a generated `sbatch` script preempted with
`scancel --signal=TERM`, requeued and resumed, the default heterogeneous script (learner and
env ranks in two components), the script for a run folder, which resumes it, and a sweep as a
job array. Without a running Slurm these tests skip, except under CI, where they fail."""

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
    mpi_launch,
    mpiexec_path,
    processes_with,
    read_events,
    restorable_checkpoint,
    run_command,
    settings,
    signal_rank_and_wait,
    start_job,
    wait_for_records,
    wait_for_updates,
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


def _sbatch(script: Path, cwd: Path, extra_env: dict[str, str] | None = None) -> str:
    """Submit `script`; the job gets this environment (sbatch's default `--export=ALL`) plus
    `extra_env`."""
    submitted = subprocess.run(
        ["sbatch", "--parsable", str(script)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        env={**os.environ, **(extra_env or {})},
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
    budget = 40_000
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
                "set": ["run.total_env_steps=20000", "run.progress=false"],
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
        assert summary["env_steps"] >= 20_000 and summary["accounting"]["reconciles"]
        assert "srun --mpi=pmi2" in (folder / "logs" / f"{trial}.log").read_text()
    rows = (folder / "trials.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",finished" in row for row in rows[1:]), rows


# Between two nodes, MPICH's UCX netmod (the mpich wheel's default) puts each rank's address in
# PMI-1 lines of up to about 1,070 bytes, and Slurm 22.05's mpi/pmi2 plugin reads a PMI-1
# request with one read of at most 1,024 bytes: a longer one is cut in two ("mpi/pmi2: value
# not properly terminated in client request"), MPI_Init fails on one side and the other
# component's ranks wait in it until the job is cancelled (the dead rank's `scancel JOB.STEP`
# ends only its own component's tasks) — two starts in five here. The OFI netmod's addresses
# fit in one line of 65 bytes. (Steps within one node exchange no addresses.)
TWO_NODES_UNDER_PMI2 = {"MPIR_CVAR_CH4_NETMOD": "ofi"}


def _needs_a_gpu_node_and_another() -> None:
    """What a heterogeneous job needs on this cluster: a node with a GPU for the learner's
    component and another for the env ranks' (Slurm's backfill, which alone starts such a job,
    plans each component on a node of its own). `.ci/start_slurm` declares both."""
    nodes = set(
        subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %G"], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()
    )
    if len(nodes) < 2 or not any(line.split()[-1].startswith("gpu") for line in nodes):
        message = (
            f"this Slurm has no GPU node beside another (sinfo: {sorted(nodes)}), so a "
            "heterogeneous job cannot start: `bash .ci/start_slurm` declares both"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def _components(job: str) -> dict[int, dict[str, str]]:
    """Each component of heterogeneous job `job` (by its HetJobOffset): NodeList, NumTasks and
    TresPerTask, as `scontrol show job` has them."""
    shown = subprocess.run(
        ["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30
    ).stdout
    components = {}
    for block in shown.split("\n\n"):
        offset = re.search(r"HetJobOffset=(\d+)", block)
        if offset is not None:
            fields = dict(re.findall(r"\b(NodeList|NumTasks|TresPerTask)=(\S*)", block))
            components[int(offset.group(1))] = fields
    return components


def _slurm_variables(pid: int) -> dict[str, str]:
    """The Slurm task's variables rank process `pid` started with: its node, its rank, and
    the step's GPUs on its node (only a task given GPUs has SLURM_STEP_GPUS; CUDA_VISIBLE_DEVICES
    every task inherits from the batch shell, which runs in component 0)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        pytest.fail(f"rank process {pid} ended before the test could read its environment")
    variables = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
    return {
        key: variables[key]
        for key in ("SLURMD_NODENAME", "SLURM_PROCID", "SLURM_STEP_GPUS")
        if key in variables
    }


def test_the_default_heterogeneous_script_trains_with_learner_and_env_ranks_apart(tmp_path):
    """`agentenv slurm` as it is by default (`--gpus 1`): a heterogeneous job whose component 0
    is the learner with its GPU and component 1 the env ranks, one MPI world through
    `srun --het-group=0,1`. On this cluster component 0 gets the node whose GPU is /dev/null
    (JAX, built for the CPU, runs on the CPU) and component 1 the other node. The run trains
    to its budget and its accounting reconciles; the start event's rank 0 is the learner and
    runs in component 0 with the step's GPU, ranks 1 and 2 are env ranks in component 1 (each
    rank's process, found by its pid, carries its Slurm task's node and GPUs).

    What differs from a cluster: the job gets MPICH's OFI netmod through its environment
    (TWO_NODES_UNDER_PMI2 says why the default, UCX, fails between nodes under this Slurm's
    pmi2 plugin), the GPU is no device, and both nodes are this machine, so every rank's
    `host` is the same."""
    _needs_a_gpu_node_and_another()
    budget = 8192
    written = run_command(
        agentenv_command(
            "slurm",
            "cartpole_ppo",
            "--env-ranks",
            "2",
            "--time",
            "00:10:00",
            *settings(
                f"run.run_dir={tmp_path / 'runs'}",
                "run.name=het",
                f"run.total_env_steps={budget}",
            ),
        ),
        timeout=120,
        cwd=tmp_path,
    )
    assert written.returncode == 0, written.stderr
    script = (tmp_path / "het.sbatch").read_text()
    assert "#SBATCH --ntasks=1\n#SBATCH --gpus-per-task=1\n#SBATCH hetjob\n" in script
    assert "\nsrun --mpi=pmi2 --het-group=0,1 " in script
    run_dir = tmp_path / "runs" / "het"
    job = None
    try:
        job = _sbatch(tmp_path / "het.sbatch", tmp_path, TWO_NODES_UNDER_PMI2)
        _wait_for_updates(run_dir, job, 1)  # every rank has started, and none has ended
        start = next(e for e in read_events(run_dir) if e["event"] == "start")
        tasks = {int(r): _slurm_variables(int(p["pid"])) for r, p in start["processes"].items()}
        assert _wait_for_state(job, ("COMPLETED", "FAILED", "CANCELLED"), 300) == "COMPLETED"
    finally:
        _cancel(job)
    components = _components(job)
    assert sorted(components) == [0, 1], components
    assert components[0]["NumTasks"] == "1" and components[0]["TresPerTask"] == "gres:gpu:1"
    assert components[1]["NumTasks"] == "2" and "TresPerTask" not in components[1]
    assert components[0]["NodeList"] != components[1]["NodeList"], components
    assert sorted(start["processes"]) == ["0", "1", "2"], start["processes"]
    assert start["runtime"]["launcher"] == "srun" and start["runtime"]["pmi"] == "PMI-2"
    assert start["runtime"]["slurm_step"] == f"{job}.0"  # one step holds both components
    assert start["processes"]["0"]["jax_devices"]["platform"] == "cpu"  # the learner
    assert all("jax_devices" not in start["processes"][rank] for rank in ("1", "2"))
    assert tasks == {
        0: {
            "SLURMD_NODENAME": components[0]["NodeList"],
            "SLURM_PROCID": "0",
            "SLURM_STEP_GPUS": "0",
        },
        1: {"SLURMD_NODENAME": components[1]["NodeList"], "SLURM_PROCID": "1"},
        2: {"SLURMD_NODENAME": components[1]["NodeList"], "SLURM_PROCID": "2"},
    }
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["topology"].startswith("1 learner + 2 env rank(s)")
    assert summary["env_steps"] >= budget and not summary["interrupted"]
    assert summary["accounting"]["reconciles"]
    assert _starts_and_stops(run_dir) == [("start", 0)]
    log = (tmp_path / "runs" / f"het.slurm-{job}.out").read_text()
    assert log.count("(reconciles)") == 1, log[-3000:]


def test_the_run_folder_script_resumes_the_run(tmp_path):
    """`agentenv slurm RUN_DIR` for a run that was stopped early (SIGTERM under `mpiexec`, a
    final checkpoint): the script it writes resumes that run (`--resume RUN_DIR`, with the
    folder's own config.yaml, and no second config beside the script). Submitted, the job's
    start resumes the saved state (a `resume` event at the stop's update, the checkpoint's
    checksum) and trains to the budget; the counters continue (updates 1, 2, ... with none
    twice or missed) and the accounting reconciles. The job has one component (`--gpus 0`);
    the heterogeneous header the default adds is the test above's."""
    budget = 8192
    runs = tmp_path / "runs"
    run_dir = runs / "early"
    proc = start_job(
        [
            *mpi_launch(3),
            *agentenv_command(
                "train",
                CARTPOLE,
                *settings(
                    f"run.run_dir={runs}",
                    "run.name=early",
                    f"run.total_env_steps={budget}",
                    "checkpoint.every_updates=5",
                ),
            ),
        ]
    )
    try:
        wait_for_updates(proc, run_dir, 4, timeout=180)
        proc.send_signal(signal.SIGTERM)  # MPICH's mpiexec passes it on and waits
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    first = json.loads((run_dir / "summary.json").read_text())
    assert first["interrupted"], "the run reached its budget before the stop"
    stopped_at = first["updates"]
    saved = [e for e in read_events(run_dir) if e["event"] == "checkpoint"][-1]
    assert saved["update"] == stopped_at

    written = run_command(
        agentenv_command(
            "slurm", str(run_dir), "--gpus", "0", "--env-ranks", "2", "--time", "00:10:00"
        ),
        timeout=120,
        cwd=tmp_path,
    )
    assert written.returncode == 0, written.stderr
    script = (tmp_path / "early.sbatch").read_text()
    assert f"\nRUN_DIR={shlex.quote(str(run_dir))}\n" in script
    assert f"  ARGS=({shlex.quote(str(run_dir / 'config.yaml'))})\n" in script
    assert not (tmp_path / "early.yaml").exists()
    job = None
    try:
        job = _sbatch(tmp_path / "early.sbatch", tmp_path)
        assert _wait_for_state(job, ("COMPLETED", "FAILED", "CANCELLED"), 300) == "COMPLETED"
    finally:
        _cancel(job)
    log = (runs / f"early.slurm-{job}.out").read_text()
    assert _starts_and_stops(run_dir) == [
        ("start", 0),
        ("interrupted", stopped_at),
        ("start", stopped_at),
        ("resume", stopped_at),
    ], log[-3000:]
    events = read_events(run_dir)
    second_start = [e for e in events if e["event"] == "start"][1]
    assert second_start["runtime"]["slurm_step"] == f"{job}.0"
    resume = next(e for e in events if e["event"] == "resume")
    assert resume["state_checksum"] == saved["state_checksum"]
    assert resume["records_cut"] == 0
    updates = [r["update"] for r in read_metrics(run_dir / "metrics.jsonl")]
    assert updates == list(range(1, len(updates) + 1)) and len(updates) > stopped_at
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= budget and not summary["interrupted"]
    assert summary["accounting"]["reconciles"]
    assert log.count("(reconciles)") == 1, log[-3000:]
