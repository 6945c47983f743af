"""Several learner processes on one global mesh: JAX's distributed runtime started from the
learners' own communicator (gloo collectives on CPU), each learner feeding its block of the
global batch; the PPO and SAC updates equal the one-device updates, PPO learns CartPole with 2
learners, SAC trains from each learner's partitions, and checkpoints move between 2 learners
and 1."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

import pytest

from agentenv_jax.transport.messages import sample_answer_spec, sample_summary_spec

from conftest import (
    REPO,
    agentenv_command,
    mpiexec_path,
    read_events,
    restorable_checkpoint,
    run_command,
    settings,
    signal_rank_and_wait,
    start_job,
    wait_for_updates,
)

TWO_HOST_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
# The stop and kill tests run one device per learner: two learners of two devices each are the
# IMPALA run's and the update job's, and on a 2-core machine busy with other jobs their gloo
# collectives slow each update down many times over (the SIGTERM test took 18 s alone and did
# not stop within 120 s at a load average of 9).
ONE_HOST_DEVICE = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


def _results(stdout: str) -> list[dict]:
    return [json.loads(line[len("RESULT") :]) for line in stdout.splitlines() if "RESULT" in line]


@pytest.mark.slow
def test_update_on_a_global_mesh_of_two_processes_equals_the_one_device_update():
    proc = run_command(
        [mpiexec_path(), "-n", "2", sys.executable, "multi_learner_update_job.py"],
        timeout=240,
        cwd=REPO / "tests",
        extra_env=TWO_HOST_DEVICES,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = _results(proc.stdout)
    assert sorted(r["process"] for r in results) == [0, 1]
    for result in results:
        assert result["processes"] == 2 and result["mesh_devices"] == 4
        # Each process holds half of the global rollout's 8 envs.
        assert result["rollout_shape"] == [16, 8, 4] and result["addressable_rows"] == 4
        assert result["max_param_change"] > 1e-3  # the updates did move the parameters
        assert result["max_param_diff"] < 1e-5
        assert result["loss_diff"] < 1e-5
        # one_psum: the 4 shards' update is the one emulated on one device (and, shuffling
        # within shards, not the xla one); one all-reduce per gradient step and one for the
        # minibatches' statistics, where XLA's own reduction runs dozens.
        assert result["one_psum_max_param_diff"] < 1e-5
        assert result["one_psum_vs_xla_max_diff"] > 1e-4
        assert result["one_psum_all_reduces"] == result["gradient_steps"] + 1
        assert result["xla_all_reduces"] > 5 * result["gradient_steps"]
        # SAC: each of the two learners feeds half the batch's rows to a mesh of one device each.
        assert result["sac_mesh_devices"] == 2
        assert result["sac_max_param_change"] > 1e-3 and result["sac_max_param_diff"] < 1e-5


def _command(learners: int, processes: int, *arguments: str) -> list[str]:
    """`mpiexec -n processes agentenv train ARGUMENTS` with L learners, no progress line."""
    return [
        mpiexec_path(),
        "-n",
        str(processes),
        *agentenv_command(
            "train",
            *arguments,
            *settings(f"topology.num_learner_ranks={learners}", "run.progress=false"),
        ),
    ]


def _train(run_dir, learners: int, processes: int, *arguments: str, devices: int = 2):
    return run_command(
        _command(learners, processes, *arguments),
        timeout=420,
        cwd=REPO,
        extra_env={"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"},
    )


def _summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
def test_two_learners_learn_cartpole_and_checkpoints_move_between_two_learners_and_one(
    run_dir,
):
    """One device per learner: with two devices in each of two learner processes, gloo's
    collectives on this 2-core machine make the run three times slower (81 s to 475 against
    25 s); learners of two devices each are the IMPALA test's and the update test's."""
    run = run_dir / "two"
    first = _train(
        run_dir,
        2,
        4,
        "cartpole_ppo",
        *settings(
            f"run.run_dir={run_dir}",
            "run.name=two",
            "run.stop_at_return=475",
            "run.total_env_steps=100000",
        ),
        devices=1,
    )
    assert first.returncode == 0, first.stderr[-4000:]
    summary = _summary(run)
    assert summary["topology"] == "2 learner + 2 env rank(s), 8 envs, 2 learner device(s)"
    assert summary["hosts"] == {socket.gethostname(): [0, 1, 2, 3]}
    assert summary["episode_return_mean"] >= 475
    assert summary["env_steps"] <= 100_000
    accounting = summary["accounting"]
    assert accounting["reconciles"] and accounting["produced"] == accounting["trained"]
    # Learner 0 alone writes the metrics: one record per update.
    assert len((run / "metrics.jsonl").read_text().splitlines()) == summary["updates"]
    saved = [e for e in read_events(run) if e["event"] == "checkpoint"][-1]

    # Saved by 2 learners (2 devices), resumed by 1 (1 device): the same state goes on.
    second = _train(run_dir, 1, 3, "--resume", str(run), devices=1)
    assert second.returncode == 0, second.stderr[-4000:]
    resumed = [e for e in read_events(run) if e["event"] == "resume"][-1]
    assert resumed["update"] == saved["update"]
    assert resumed["state_checksum"] == pytest.approx(saved["state_checksum"], rel=1e-6)
    assert _summary(run)["topology"].startswith("1 learner + 2 env rank(s)")
    saved = [e for e in read_events(run) if e["event"] == "checkpoint"][-1]

    # And back to 2 learners.
    third = _train(run_dir, 2, 4, "--resume", str(run), devices=1)
    assert third.returncode == 0, third.stderr[-4000:]
    resumed = [e for e in read_events(run) if e["event"] == "resume"][-1]
    assert resumed["update"] == saved["update"] > summary["updates"]
    assert resumed["state_checksum"] == pytest.approx(saved["state_checksum"], rel=1e-6)
    final = _summary(run)
    assert final["topology"].startswith("2 learner + 2 env rank(s)")
    whole_run = final["accounting"]
    assert whole_run["reconciles"] and whole_run["trained"] == final["env_steps"]


@pytest.mark.slow
def test_impala_with_two_learners_reaches_its_threshold_with_bounded_lag(run_dir):
    """IMPALA's asynchronous env ranks feed two learners: return >= 450 within 500k steps, lag
    within its bound on every learner's env ranks, the whole run's accounting reconciles.

    Two learners on CPU are slower than their env ranks, so every segment arrives at the lag
    bound; at a bound of 2 (with standardized advantages, as shipped then), 1 of 16 seeds ended
    at 222 after 500k steps and another needed 456k, while at a bound of 1 all 20 seeds reached
    450 within 222k."""
    max_lag = 1
    proc = _train(
        run_dir,
        2,
        4,
        "cartpole_impala",
        *settings(
            f"run.run_dir={run_dir}",
            "run.name=impala",
            "run.stop_at_return=450",
            f"algorithm.max_policy_lag={max_lag}",
        ),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = _summary(run_dir / "impala")
    assert summary["topology"] == "2 learner + 2 env rank(s), 16 envs, 4 learner device(s)"
    assert summary["episode_return_mean"] >= 450 and summary["env_steps"] <= 500_000
    assert summary["accounting"]["reconciles"]
    records = [
        json.loads(line) for line in (run_dir / "impala" / "metrics.jsonl").read_text().splitlines()
    ]
    assert max(r["policy_lag_max"] for r in records) == max_lag
    assert len(summary["env_rank_cpu_share"]) == 2


@pytest.mark.slow
def test_sac_with_two_learners_trains_from_their_partitions_and_reconciles(run_dir):
    """SAC on two learner processes (one device each), each serving the partitions of its own
    env rank, for 1,000 updates past `learning_starts`: the whole replay reconciles, the sample
    ratio held and both partitions were drawn from. That their update is the one-device update
    is the first test's; that SAC learns Pendulum from sharded replay is test_training's (two
    learners reach -300 at about 7,200 env steps, which takes 6,000 updates: over 2 minutes
    here)."""
    budget = 2000
    proc = _train(
        run_dir,
        2,
        4,
        "pendulum_sac",
        *settings(f"run.run_dir={run_dir}", "run.name=sac", f"run.total_env_steps={budget}"),
        devices=1,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = _summary(run_dir / "sac")
    assert summary["topology"] == "2 learner + 2 env rank(s), 4 envs, 2 learner device(s)"
    assert budget <= summary["env_steps"] <= budget + 4
    accounting = summary["accounting"]
    assert accounting["reconciles"] and accounting["inserted"] == summary["env_steps"]
    assert accounting["trained"] >= 900 * 128
    last = json.loads((run_dir / "sac" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["replay/sampled"] <= 128 * (last["replay/inserted"] - 1000) + 128 * 2
    assert len(last["replay/partition_mass"]) == 2 and min(last["replay/partition_mass"]) > 0
    # The learners exchange their partitions' summaries and one float each, never the rows:
    # each trains on the rows its own partition drew.
    summary_bytes = sample_summary_spec().nbytes
    assert last["replay/learner_exchange_bytes"] == 2 * (summary_bytes + 8)
    assert summary_bytes + 8 < sample_answer_spec(128, (3,), 1).nbytes // 10


@pytest.mark.slow
@pytest.mark.parametrize(
    ("experiment", "overrides", "extra_env", "message"),
    [
        (
            "cartpole_ppo",
            [],
            {"AGENTENV_COORDINATOR_HOST": "unreachable.invalid"},
            "learner 1 could not reach the coordinator at unreachable.invalid:",
        ),
        (
            "cartpole_ppo",
            ["topology.learner_devices=3"],
            {},
            "topology.learner_devices = 3 is not allowed: only 2 local devices are visible",
        ),
        (
            "cartpole_ppo",
            ["topology.learner_devices=3"],
            {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
            "topology.learner_devices = 3 is not allowed: it times 2 learner processes must "
            "divide the batch sizes [8, 256]",
        ),
        (
            "arithmetic_ppo",
            ["algorithm.packed_row_length=20"],
            {},
            "algorithm.packed_row_length = 20: packed minibatches are packed by one learner "
            "process (its devices split the rows), and this run's learner mesh spans several",
        ),
    ],
    ids=[
        "unreachable_coordinator",
        "more_devices_than_a_learner_has",
        "mesh_not_dividing_batch",
        "packing_across_learners",
    ],
)
def test_two_learner_start_up_errors_stop_every_rank_with_one_message(
    run_dir, experiment, overrides, extra_env, message
):
    started = time.monotonic()
    proc = run_command(
        _command(
            2,
            4,
            experiment,
            *settings(
                f"run.run_dir={run_dir}",
                "run.name=refused",
                "run.transport_timeout_s=5",
                *overrides,
            ),
        ),
        timeout=60,
        cwd=REPO,
        extra_env={**TWO_HOST_DEVICES, **extra_env},
    )
    assert proc.returncode != 0
    assert time.monotonic() - started < 45
    assert message in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("agentenv: error:") == 1, proc.stderr[-3000:]
    assert not (run_dir / "refused").exists()


def test_a_failed_gloo_collective_is_told_from_other_errors():
    """What learner 0 sees when learner 1's process ends mid-collective (see the next test)."""
    import jax

    from agentenv_jax.parallel.distributed import is_collective_failure

    reset = "INTERNAL: Gloo all-reduce failed: [pair.cc:534] Read error: Connection reset by peer"
    assert is_collective_failure(jax.errors.JaxRuntimeError(reset))
    assert not is_collective_failure(
        jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: out of memory")
    )
    assert not is_collective_failure(RuntimeError(reset))  # not from XLA's runtime
    # A checkpoint save under way when the peer died: orbax's all-gather, then orbax's own frame.
    gather = "UNKNOWN: Gloo AllGather failed: [pair.cc:538] Read error: Connection reset by peer"
    try:
        try:
            raise ValueError(gather)
        except ValueError as err:
            raise RuntimeError("the save did not finish") from err
    except RuntimeError as err:
        assert is_collective_failure(err)
    assert not is_collective_failure(ValueError("rollout.num_envs must be positive"))


@pytest.mark.slow
def test_a_killed_second_learner_is_named_and_the_checkpoint_restores(run_dir):
    """SIGKILL learner 1 of two mid-run: its rank is named and every rank stops within seconds
    (learner 0 may be waiting inside a cross-process collective); the last checkpoint, saved by
    both learners together, restores."""
    run = run_dir / "kill"
    proc = start_job(
        _command(
            2,
            4,
            "cartpole_ppo",
            *settings(
                f"run.run_dir={run_dir}",
                "run.name=kill",
                "checkpoint.every_updates=5",
                "run.transport_timeout_s=20",
            ),
        ),
        extra_env=ONE_HOST_DEVICE,
    )
    ended = signal_rank_and_wait(proc, run, 1, after_updates=12)
    assert proc.returncode != 0
    assert ended.ended_after < 30
    named = f"rank 1 (pid {ended.pid}) was killed by SIGKILL"
    assert named in ended.stderr, (ended.stdout + ended.stderr)[-3000:]
    # Learner 0's collective failing with it is a consequence, not a second error to show.
    assert "Traceback" not in ended.stderr, ended.stderr[-3000:]
    assert ended.stderr.count("agentenv: error:") == 1, ended.stderr[-3000:]
    assert restorable_checkpoint(run) >= 5


@pytest.mark.slow
def test_sigterm_to_the_second_learner_alone_stops_both_with_a_final_checkpoint(run_dir):
    """A stop signal that reaches learner 1 only: the learners agree on it at the next round,
    so both stop together, write the final checkpoint and the interrupted summary."""
    run = run_dir / "term"
    proc = start_job(
        _command(
            2,
            4,
            "cartpole_ppo",
            *settings(f"run.run_dir={run_dir}", "run.name=term", "run.total_env_steps=1000000"),
        ),
        extra_env=ONE_HOST_DEVICE,
    )
    try:
        wait_for_updates(proc, run, 5, timeout=180)
        pid = next(e for e in read_events(run) if e["event"] == "start")["processes"]["1"]["pid"]
        os.kill(pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, (stdout + stderr)[-3000:]
    summary = _summary(run)
    assert summary["interrupted"] and summary["accounting"]["reconciles"]
    events = read_events(run)
    stopped = [e["update"] for e in events if e["event"] == "interrupted"]
    assert stopped == [summary["updates"]]
    assert [e for e in events if e["event"] == "checkpoint"][-1]["update"] == summary["updates"]
    assert restorable_checkpoint(run) == summary["updates"]
