"""Checkpoints: orbax round trip, keep-K, preemption by SIGTERM, resume (also over other env-rank
counts), refused resumes that change nothing, and saved replay partitions."""

from __future__ import annotations

import json
import os
import signal
import time

import jax.numpy as jnp
import numpy as np
import pytest

from agentenv_jax.checkpoint import CheckpointError, CheckpointStore
from agentenv_jax.config.loading import load_config
from agentenv_jax.metrics.logger import read_metrics

from conftest import (
    EXPERIMENTS,
    REPO,
    agentenv_command,
    is_open_mpi,
    mpi_launch,
    mpiexec_path,
    read_events,
    run_command,
    settings,
    start_job,
    wait_for_updates,
)

CARTPOLE = str(EXPERIMENTS / "cartpole_ppo.yaml")
SAC = str(EXPERIMENTS / "pendulum_sac.yaml")


def test_store_round_trip_keeps_newest_and_ignores_unfinished_saves(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    state = {"w": jnp.arange(4.0), "step": jnp.int32(0)}
    for step in (1, 2, 3):
        store.save(step, {"w": state["w"] * step, "step": jnp.int32(step)}, {"step": step})
    # A save that crashed half-way leaves only orbax's temporary folder behind.
    (store.directory / "4.orbax-checkpoint-tmp-123").mkdir()
    assert store.latest_step() == 3
    assert sorted(p.name for p in store.directory.iterdir() if p.name.isdigit()) == ["2", "3"]
    restored, meta = store.restore(state)
    np.testing.assert_array_equal(restored["w"], np.arange(4.0) * 3)
    assert meta == {"step": 3}
    with pytest.raises(CheckpointError, match="does not match"):
        store.restore({"w": jnp.zeros(5), "step": jnp.int32(0)})
    store.close()


@pytest.mark.slow
@pytest.mark.openmpi
def test_stopped_by_the_launchers_stop_signal_then_resumed(tmp_path):
    run_dir = tmp_path / "pre"
    proc = start_job(
        [
            *mpi_launch(3),
            *agentenv_command(
                "train",
                CARTPOLE,
                "--set",
                f"run.run_dir={tmp_path}",
                "--set",
                "run.name=pre",
                "--set",
                "checkpoint.every_updates=10",
            ),
        ]
    )
    # The stop request each launcher passes on and waits for: SIGTERM (as Slurm sends on
    # preemption) under MPICH; SIGUSR2 under Open MPI, whose mpirun kills every rank a fraction
    # of a second after passing a SIGTERM on (test_signals.py measures it).
    stop = signal.SIGUSR2 if is_open_mpi() else signal.SIGTERM
    try:
        wait_for_updates(proc, run_dir, 25, timeout=180)
        proc.send_signal(stop)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, stderr[-3000:]
    assert (run_dir / "summary.json").exists(), "the ranks ended before their final summary"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] and summary["accounting"]["reconciles"]
    stopped_at = summary["updates"]
    assert 25 <= stopped_at < 391
    events = read_events(run_dir)
    # The signal may land just after a periodic save, in which case no second save follows.
    assert [e["update"] for e in events if e["event"] == "interrupted"] == [stopped_at]
    saved = [e for e in events if e["event"] == "checkpoint"][-1]
    assert saved["update"] == stopped_at
    store = CheckpointStore(run_dir, keep=3)
    assert store.latest_step() == stopped_at
    store.close()

    # Resumed with 3 env ranks where it ran with 2: the state does not depend on the topology.
    resumed = run_command(
        [
            *mpi_launch(4),
            *agentenv_command("train", "--resume", str(run_dir), "--set", "run.stop_at_return=475"),
        ],
        timeout=300,
        cwd=REPO,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    resume_event = next(e for e in read_events(run_dir) if e["event"] == "resume")
    assert resume_event["update"] == stopped_at
    # The learner state after the resume is the one that was saved.
    assert resume_event["state_checksum"] == saved["state_checksum"]
    records = read_metrics(run_dir / "metrics.jsonl")
    updates = [r["update"] for r in records]
    assert updates == list(range(1, len(records) + 1))  # counters continue, file appended
    steps = [r["env_steps"] for r in records]
    assert steps == sorted(steps)
    final = json.loads((run_dir / "summary.json").read_text())
    assert not final["interrupted"] and "3 env rank(s)" in final["topology"]
    assert final["episode_return_mean"] >= 475 and final["env_steps"] <= 100_000
    assert final["accounting"]["reconciles"] and final["accounting"]["trained"] == steps[-1]


def _files(folder) -> dict[str, bytes]:
    """Every file under `folder`, by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


# Resumes that must be refused: (arguments after `--resume RUN`, what the one message says).
REFUSED_RESUMES = [
    (settings("env.id=Acrobot-v1"), "env.id = 'CartPole-v1'; this config has 'Acrobot-v1'"),
    (settings("algorithm={name: impala}"), "algorithm.name = 'ppo'; this config has 'impala'"),
    (
        settings("network.actor_hidden=[32,32]"),
        "network.actor_hidden = [64, 64]; this config has [32, 32]",
    ),
    (settings("algorithm.gama=0.9"), "unknown key 'algorithm.gama' (did you mean 'gamma'?)"),
    (["{other}"], "a config file ('{other}') is not allowed with it"),
]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["one_process", "mpiexec"])
def test_a_refused_resume_leaves_every_file_of_the_run_as_it_was(launcher, tmp_path):
    """Another env.id or algorithm.name, a network change, a bad override or another config
    file: one clear message, a non-zero exit on every rank, and not one byte of the run changed
    (its config.yaml included, so the run can still be resumed)."""
    first = run_command(
        [
            *agentenv_command("train", CARTPOLE),
            *settings(
                f"run.run_dir={tmp_path}",
                "run.name=small",
                "run.total_env_steps=512",
                "run.progress=false",
            ),
        ],
        timeout=120,
        cwd=REPO,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "small"
    before = _files(run_dir)
    assert {"config.yaml", "metrics.jsonl", "events.jsonl", "summary.json"} <= set(before)
    launcher_args = [mpiexec_path(), "-n", "3"] if launcher == "mpiexec" else []
    for arguments, message in REFUSED_RESUMES:
        arguments = [
            a.replace("{other}", str(EXPERIMENTS / "cartpole_impala.yaml")) for a in arguments
        ]
        message = message.replace("{other}", str(EXPERIMENTS / "cartpole_impala.yaml"))
        started = time.monotonic()
        proc = run_command(
            [*launcher_args, *agentenv_command("train", *arguments, "--resume", str(run_dir))],
            timeout=60,
            cwd=REPO,
        )
        assert proc.returncode != 0 and time.monotonic() - started < 60, arguments
        assert proc.stderr.count("agentenv: error:") == 1, proc.stderr[-3000:]
        assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert _files(run_dir) == before, f"{arguments} changed the run's files"
    # The run is still whole: it resumes and goes on.
    resumed = run_command(
        [
            *launcher_args,
            *agentenv_command("train", "--resume", str(run_dir)),
            *settings("run.total_env_steps=1024", "run.progress=false"),
        ],
        timeout=120,
        cwd=REPO,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] == 1024


@pytest.mark.slow
def test_resumed_twice_over_other_env_rank_counts_the_whole_run_reconciles(tmp_path):
    """IMPALA (env ranks run ahead, so segments are in flight at every stop) in one process, then
    resumed under `mpiexec -n 3` and `-n 4`: after each leg the accounting covers the whole run
    and reconciles, late segments of earlier legs are kept, each leg's own share reconciles
    too, and steps/s is the leg's own steps over the leg's own time."""
    run_dir = tmp_path / "legs"
    legs = [
        ([], ["train", str(EXPERIMENTS / "cartpole_impala.yaml")], 2048, "1 env rank(s)"),
        ([mpiexec_path(), "-n", "3"], ["train", "--resume", str(run_dir)], 4096, "2 env rank(s)"),
        ([mpiexec_path(), "-n", "4"], ["train", "--resume", str(run_dir)], 6144, "3 env rank(s)"),
    ]
    previous = {
        "env_steps": 0,
        "accounting": dict.fromkeys(
            ("produced", "sent", "received", "trained", "unsent", "late"), 0
        ),
    }
    for launcher, command, budget, topology in legs:
        proc = run_command(
            [
                *launcher,
                *agentenv_command(*command),
                *settings(
                    f"run.run_dir={tmp_path}",
                    "run.name=legs",
                    f"run.total_env_steps={budget}",
                    "run.progress=false",
                ),
            ],
            timeout=180,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert topology in summary["topology"]
        whole = summary["accounting"]
        assert whole["reconciles"], whole
        assert whole["trained"] == summary["env_steps"] == budget
        leg = {k: whole[k] - previous["accounting"][k] for k in previous["accounting"]}
        assert leg["produced"] == leg["sent"] + leg["unsent"], leg
        assert leg["received"] == leg["trained"] + leg["late"], leg
        # In one process the env rank always runs ahead; under MPI what it ran ahead with
        # arrives late, or stays unsent when it had no credit.
        assert leg["late"] > 0 if not launcher else leg["late"] + leg["unsent"] > 0, leg
        leg_steps = summary["env_steps"] - previous["env_steps"]
        assert summary["steps_per_s"] * summary["wall_s"] == pytest.approx(leg_steps)
        previous = summary
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["update"] for r in records] == list(range(1, 6144 // 512 + 1))
    events = read_events(run_dir)
    resumes = [e for e in events if e["event"] == "resume"]
    assert len(resumes) == 2
    for resume in resumes:  # each leg started from the state the previous one saved
        saved = [e for e in events if e["event"] == "checkpoint" and e["time"] < resume["time"]]
        assert resume["state_checksum"] == saved[-1]["state_checksum"]


@pytest.mark.slow
def test_resume_of_a_folder_without_checkpoints_is_a_clear_error(tmp_path):
    proc = run_command(agentenv_command("train", "--resume", str(tmp_path)), timeout=60, cwd=REPO)
    assert proc.returncode == 2
    assert "not a run directory with checkpoints" in proc.stderr


@pytest.mark.slow
def test_a_new_run_refuses_an_existing_run_folder(tmp_path):
    args = [
        "train",
        CARTPOLE,
        "--set",
        f"run.run_dir={tmp_path}",
        "--set",
        "run.name=taken",
        "--set",
        "run.total_env_steps=256",
        "--set",
        "run.progress=false",
    ]
    assert run_command(agentenv_command(*args), timeout=120, cwd=REPO).returncode == 0
    before = (tmp_path / "taken" / "metrics.jsonl").read_text()
    again = run_command(agentenv_command(*args), timeout=120, cwd=REPO)
    assert again.returncode == 2
    assert "already holds a run" in again.stderr and "--resume" in again.stderr
    assert (tmp_path / "taken" / "metrics.jsonl").read_text() == before  # nothing appended


@pytest.mark.slow
def test_replay_partitions_saved_per_env_rank_restore_over_more_ranks(tmp_path):
    """SAC with checkpoint.save_replay: 2 env ranks save their partitions with each checkpoint;
    the run resumed with 3 env ranks loads every saved transition back and goes on learning at
    once, where a refilled buffer would still be waiting for learning_starts. Then a damaged
    partition file makes the next resume a clean refusal."""
    run_dir = tmp_path / "sac"
    first = run_command(
        [
            mpiexec_path(),
            "-n",
            "3",
            *agentenv_command("train", SAC),
            *settings(
                f"run.run_dir={tmp_path}",
                "run.name=sac",
                "run.total_env_steps=1600",
                "algorithm.log_interval=50",
                "checkpoint.every_updates=250",
                "checkpoint.keep=2",
                "checkpoint.save_replay=true",
            ),
        ],
        timeout=300,
        cwd=REPO,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    saved = json.loads((run_dir / "summary.json").read_text())
    stored = saved["accounting"]["stored"]
    assert stored >= 1600 - 8  # nothing overwritten (capacity 100k); n-step 1: nothing pending
    store = CheckpointStore(run_dir, keep=2)
    steps = store.steps()
    store.close()
    assert steps[-1] == saved["updates"] and len(steps) == 2
    # One set per kept checkpoint (the periodic ones and the final one); older sets pruned.
    assert sorted(int(p.name) for p in (run_dir / "replay").iterdir()) == steps
    assert sorted(p.name for p in (run_dir / "replay" / str(steps[-1])).iterdir()) == [
        "partition-0-of-2.npz",
        "partition-1-of-2.npz",
    ]

    resumed = run_command(
        [
            *mpi_launch(4),
            *agentenv_command("train", "--resume", str(run_dir)),
            *settings("run.total_env_steps=2000"),
        ],
        timeout=300,
        cwd=REPO,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["topology"].startswith("1 learner + 3 env rank(s)")
    accounting = final["accounting"]
    assert accounting["restored"] == stored and accounting["reconciles"], accounting
    # About one update per new env step, from the first: no wait for 1000 new transitions.
    assert final["updates"] - saved["updates"] >= 300
    records = read_metrics(run_dir / "metrics.jsonl")
    assert records[-1]["replay/restored"] == stored

    # A saved partition that cannot be read is found by an env rank while the roles are built,
    # after the learner has restored its checkpoint: the start is still called off on every
    # rank with one message naming the file, MPI finalizes with no request left pending, and
    # no file of the run changes (events and config included).
    damaged = sorted((run_dir / "replay").glob("*/partition-0-of-3.npz"))[-1]
    damaged.write_text("not an archive\n")
    before = _files(run_dir)
    refused = run_command(
        [
            mpiexec_path(),
            "-n",
            "3",
            *agentenv_command("train", "--resume", str(run_dir)),
            *settings("run.total_env_steps=2400"),
        ],
        timeout=60,
        cwd=REPO,
    )
    assert refused.returncode != 0
    assert refused.stderr.count("agentenv: error:") == 1, refused.stderr[-3000:]
    assert f"cannot read saved replay partition {damaged}" in refused.stderr
    assert "Traceback" not in refused.stderr and "pending" not in refused.stderr
    assert _files(run_dir) == before


@pytest.mark.slow
def test_replay_partition_saved_and_restored_in_one_process(tmp_path):
    """The same round trip without a launcher (the in-process transport carries the word)."""
    quiet = settings("algorithm.log_interval=50", "run.progress=false")
    first = run_command(
        [
            *agentenv_command("train", SAC),
            *settings(
                f"run.run_dir={tmp_path}",
                "run.name=one",
                "run.total_env_steps=1200",
                "checkpoint.save_replay=true",
            ),
            *quiet,
        ],
        timeout=300,
        cwd=REPO,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "one"
    saved = json.loads((run_dir / "summary.json").read_text())
    assert (run_dir / "replay" / str(saved["updates"]) / "partition-0-of-1.npz").is_file()
    resumed = run_command(
        [
            *agentenv_command("train", "--resume", str(run_dir)),
            *settings("run.total_env_steps=1400"),
            *quiet,
        ],
        timeout=300,
        cwd=REPO,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["accounting"]["restored"] == saved["accounting"]["stored"] > 1000
    assert final["accounting"]["reconciles"]
    assert final["updates"] - saved["updates"] >= 150


def test_a_checkpoint_from_before_a_setting_existed_resumes_with_its_default(tmp_path):
    """Checkpoints written before `network.torso` and `env.backend` existed hold configs
    without them: those runs used the defaults, so they stay resumable; a real change is not."""
    from agentenv_jax.checkpoint.run_folder import check_compatible
    from agentenv_jax.config.loading import config_to_dict

    current = load_config(EXPERIMENTS / "cartpole_ppo.yaml")
    saved = config_to_dict(current)
    del saved["network"]["torso"], saved["env"]["backend"]
    check_compatible(saved, current, tmp_path)
    changed = load_config(EXPERIMENTS / "cartpole_ppo.yaml", ["network.torso=impala_cnn"])
    with pytest.raises(CheckpointError, match=r"network.torso = 'auto'; this config has 'impala"):
        check_compatible(saved, changed, tmp_path)
