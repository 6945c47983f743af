"""Sweeps: the sweep file and its trials (pure), the results statistics, and real sweeps of
`agentenv train` processes and mpiexec jobs that are killed and resumed."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

import agentenv_jax as ae
from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.experiments import shipped_sweeps
from agentenv_jax.workflow.sweeps.results import (
    interquartile_means,
    sessions_file,
    trial_folder,
    trial_row,
    whole_trial_timing,
)
from agentenv_jax.workflow.sweeps.runner import SweepRunner, _Running, progress_heads, trial_command
from agentenv_jax.workflow.sweeps.spec import check_trials, expand, read_sweep

from conftest import (
    agentenv_command,
    read_events,
    run_command,
    settings,
    start_job,
    wait_for_updates,
)

TRIAL_BUDGET = ["run.total_env_steps=1024", "run.progress=false", "env.global_num_envs=4"]


def _sweep_file(folder: Path, **fields) -> Path:
    body = {"base": "cartpole_ppo", "run_dir": str(folder / "runs"), **fields}
    path = folder / f"{fields.get('name', 'sweep')}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def test_grid_expands_seed_major_with_every_combination(tmp_path):
    spec = read_sweep(
        _sweep_file(
            tmp_path,
            parameters={"algorithm.learning_rate": [1e-3, 3e-4], "algorithm.clip_eps": [0.1, 0.2]},
            seeds=[5, 7],
        )
    )
    trials = expand(spec)
    assert [(t.config_index, t.seed) for t in trials] == [(c, s) for s in (5, 7) for c in range(4)]
    assert trials[1].params == (("algorithm.learning_rate", 1e-3), ("algorithm.clip_eps", 0.2))
    assert trials[1].name == "c01-learning_rate=0.001-clip_eps=0.2-seed5"
    assert trials[1].overrides() == [
        "algorithm.learning_rate=0.001",
        "algorithm.clip_eps=0.2",
        "run.seed=5",
    ]
    assert len({t.name for t in trials}) == 8


def test_random_search_draws_the_same_configs_within_bounds(tmp_path):
    path = _sweep_file(
        tmp_path,
        method="random",
        samples=6,
        parameters={
            "algorithm.learning_rate": {"log_uniform": [1e-5, 1e-2]},
            "algorithm.num_epochs": {"int_uniform": [1, 4]},
            "algorithm.gae_lambda": [0.9, 0.95],
        },
        seeds=2,
    )
    first, again = expand(read_sweep(path)), expand(read_sweep(path))
    assert first == again and len(first) == 12
    draws = [dict(t.params) for t in first[:6]]
    assert all(1e-5 <= d["algorithm.learning_rate"] <= 1e-2 for d in draws)
    assert all(d["algorithm.num_epochs"] in (1, 2, 3, 4) for d in draws)
    assert {d["algorithm.gae_lambda"] for d in draws} <= {0.9, 0.95}
    assert len({d["algorithm.learning_rate"] for d in draws}) == 6
    assert [dict(t.params) for t in first[6:]] == draws  # the second seed of the same configs


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"parameters": {"algorithm.learning_rate": {"uniform": [0, 1]}}}, "needs method: random"),
        ({"method": "random", "parameters": {}}, "needs samples"),
        ({"parameters": {"run.seed": [1, 2]}}, "the sweep sets run.seed itself"),
        ({"paramters": {}}, "unknown key 'paramters'"),
        ({"seeds": 0}, "seeds = 0 is not allowed"),
        ({"goal": "up"}, "goal = 'up' is not allowed"),
        (
            {"method": "random", "samples": 2, "parameters": {"a.b": {"normal": [0, 1]}}},
            "distribution 'normal' is not allowed",
        ),
    ],
)
def test_bad_sweep_files_name_the_field(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message):
        read_sweep(_sweep_file(tmp_path, **fields))


def test_a_bad_trial_config_is_refused_before_any_trial_runs(tmp_path):
    spec = read_sweep(_sweep_file(tmp_path, parameters={"algorithm.learning_rat": [1e-3]}))
    with pytest.raises(ConfigError, match=r"trial c00-learning_rat=0.001-seed0: .*learning_rate"):
        check_trials(spec, expand(spec))


def test_interquartile_mean_and_its_bootstrap_interval():
    estimates = interquartile_means({0: [1.0, 2.0, 3.0, 100.0], 1: [5.0, 5.0]})
    iqm, low, high = estimates[0]
    assert iqm == pytest.approx(2.5)  # the middle half: mean of 2 and 3
    assert 1.0 <= low <= iqm <= high <= 100.0 and low < high
    assert estimates[1] == pytest.approx((5.0, 5.0, 5.0))
    assert interquartile_means({0: [1.0, 2.0, 3.0, 100.0]})[0] == estimates[0]  # fixed state


def test_progress_counts_each_trial_that_ends_once_with_its_own_count():
    both = {"a": "finished", "b": "finished"}
    assert progress_heads(both, ["a", "b"]) == ["[1/2 done]", "[2/2 done]"]
    # One finished earlier, one failed, one ended now and one whose summary is already on disk
    # but whose process has not exited yet (reported at a later poll, with its own count).
    statuses = {"a": "finished", "b": "incomplete", "c": "finished", "d": "finished"}
    assert progress_heads(statuses, ["b", "c"], running=["d"]) == ["[1/4 done]", "[2/4 done]"]
    assert progress_heads(statuses, ["d"]) == ["[3/4 done]"]


def test_the_runner_reports_two_trials_ending_in_one_poll_each_once(tmp_path):
    """Two trials whose processes ended between two polls: the runner says [1/2 done] for the
    first and [2/2 done] for the second (it said [2/2 done] twice)."""
    spec = read_sweep(_sweep_file(tmp_path, name="two", seeds=2))
    trials = expand(spec)
    said: list[str] = []
    runner = SweepRunner(spec, trials, say=said.append)
    ended = []
    for trial in trials:
        folder = trial_folder(spec, trial)
        folder.mkdir(parents=True)
        summary = {"interrupted": False, "episode_return_mean": 100.0 + trial.seed}
        (folder / "summary.json").write_text(json.dumps(summary | {"compile_s": 1.0}))
        process = SimpleNamespace(returncode=0, poll=lambda: 0)
        log = open(tmp_path / f"{trial.name}.log", "w")  # noqa: SIM115 (the runner closes it)
        ended.append(_Running(trial, process, log, time.perf_counter()))
    runner._finished(ended)
    assert [line.split(" finished ")[0] for line in said] == ["[1/2 done]", "[2/2 done]"]
    assert [line.split(" finished ")[1].split(":")[0] for line in said] == [t.name for t in trials]
    assert all(r.log.closed for r in ended) and not runner.failed


def _session(folder: Path, started: float, ended: float, summary: dict | None = None) -> None:
    """One session of a hand-made run folder: its start event at `started`, a checkpoint at
    `ended`, and, if given, the summary.json it wrote when it ended."""
    with open(folder / "events.jsonl", "a") as f:
        f.write(json.dumps({"event": "start", "time": started, "update": 0}) + "\n")
        f.write(json.dumps({"event": "checkpoint", "time": ended, "update": 4}) + "\n")
    if summary is not None:
        path = folder / "summary.json"
        path.write_text(json.dumps({"episode_return_mean": 50.0, "compile_s": 1.0} | summary))
        os.utime(path, (ended + 1, ended + 1))


def test_a_resumed_trial_times_all_its_sessions(tmp_path):
    """A trial stopped with a checkpoint (10 s), resumed and killed outright after a checkpoint
    (no summary: 3 s from its start event to its last checkpoint), then resumed to the end (5 s):
    its wall time is the three sessions' and its rate its env steps over them. It used to be the
    last session's alone."""
    spec = read_sweep(_sweep_file(tmp_path, name="resumed"))
    (trial,) = expand(spec)
    folder = trial_folder(spec, trial)
    (folder / "checkpoints" / "4").mkdir(parents=True)
    first = {"interrupted": True, "wall_s": 10.0, "env_steps": 1000, "steps_per_s": 100.0}
    _session(folder, 1000.0, 1009.0, first)
    assert trial_command(spec, trial)[-2:] == ["--resume", str(folder)]
    assert trial_command(spec, trial)[-2:] == ["--resume", str(folder)]  # kept once
    _session(folder, 2000.0, 2003.0)  # killed: the summary is still the first session's
    trial_command(spec, trial)
    last = {"interrupted": False, "wall_s": 5.0, "env_steps": 3000, "steps_per_s": 400.0}
    _session(folder, 3000.0, 3004.0, last)
    kept = [json.loads(line) for line in sessions_file(spec, trial).read_text().splitlines()]
    assert kept == [
        {"started": 1000.0, "wall_s": 10.0, "estimated": False},
        {"started": 2000.0, "wall_s": 3.0, "estimated": True},
    ]
    row = trial_row(spec, trial)
    assert row["status"] == "finished"
    assert row["wall_s"] == pytest.approx(18.0)
    assert row["steps_per_s"] == pytest.approx(3000 / 18.0)
    assert row["env_steps"] == 3000 and row["compile_s"] == 1.0
    # A trial that ran in one session keeps its summary's figures exactly.
    assert whole_trial_timing(last, []) == {"wall_s": 5.0, "steps_per_s": 400.0}
    # Started again from scratch (no checkpoint left), its kept sessions go with its folder.
    shutil.rmtree(folder / "checkpoints")
    trial_command(spec, trial)
    assert not folder.exists() and not sessions_file(spec, trial).exists()


@pytest.mark.slow
def test_a_trial_stopped_and_resumed_by_the_sweep_times_both_sessions(tmp_path):
    """SIGTERM the sweep mid-trial (the trial checkpoints and writes its summary), run it
    again: the trial resumes from that checkpoint (its resume event has the checkpoint's
    update and state checksum), and trials.csv's wall time is both sessions' (the first one's
    summary, read before the resume replaced it, plus the last one's)."""
    budget = ["run.total_env_steps=20000", "run.progress=false", "env.global_num_envs=4"]
    path = _sweep_file(tmp_path, name="stop", set=budget)
    folder = tmp_path / "runs" / "stop"
    trial = folder / "trials" / "c00-seed0"
    sweep = start_job(agentenv_command("sweep", str(path)), cwd=tmp_path)
    wait_for_updates(sweep, trial, 2, timeout=180)
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=120) == 130, sweep.communicate()
    first = json.loads((trial / "summary.json").read_text())
    assert first["interrupted"] and first["env_steps"] < 20000, "stop the trial mid-way"
    saved = [e for e in read_events(trial) if e["event"] == "checkpoint"][-1]  # on the stop

    resumed = run_command(agentenv_command("sweep", str(path)), timeout=300, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # The trial went on from that checkpoint: its one resume restored that update and state.
    resumes = [e for e in read_events(trial) if e["event"] == "resume"]
    assert len(resumes) == 1, f"the trial resumed {len(resumes)} times, not once"
    (resume,) = resumes
    assert resume["update"] == saved["update"] > 0
    assert resume["state_checksum"] == saved["state_checksum"]
    assert "resumed trial 1 of 1" in resumed.stdout
    last = json.loads((trial / "summary.json").read_text())
    (row,) = _read_csv(folder / "trials.csv")
    assert row["status"] == "finished"
    assert float(row["wall_s"]) == pytest.approx(first["wall_s"] + last["wall_s"])
    assert float(row["steps_per_s"]) == pytest.approx(
        last["env_steps"] / (first["wall_s"] + last["wall_s"])
    )


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _summaries(folder: Path) -> dict[str, float]:
    """Modification times of the finished trials' summaries, by trial (a trial stopped by a
    signal writes one too, marked interrupted)."""
    return {
        p.parent.name: p.stat().st_mtime
        for p in folder.glob("trials/*/summary.json")
        if not json.loads(p.read_text())["interrupted"]
    }


def _sweep_processes(folder: Path) -> list[str]:
    """Command lines of live processes that work in the sweep folder (trials)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(folder) in cmdline and "agentenv_jax.workflow.cli" in cmdline:
            found.append(cmdline)
    return found


@pytest.mark.slow
def test_grid_sweep_is_killed_resumed_and_tabled(tmp_path):
    """A grid of two configs with 2 seeds, two trials at a time: SIGKILL the sweep once a
    trial has finished; its trials stop with it; the same command resumes without redoing the
    finished ones, and the tables have a row per trial and per config. (The expansion of
    several parameters is test_grid_expands_seed_major_with_every_combination's.)"""
    path = _sweep_file(
        tmp_path,
        name="grid",
        set=TRIAL_BUDGET,
        parameters={"algorithm.clip_eps": [0.1, 0.2]},
        seeds=2,
        parallel=2,
    )
    folder = tmp_path / "runs" / "grid"
    sweep = start_job(agentenv_command("sweep", str(path)), cwd=tmp_path)
    deadline = time.monotonic() + 240
    while not _summaries(folder):
        assert sweep.poll() is None, sweep.communicate()
        assert time.monotonic() < deadline, "the sweep finished no trial in time"
        time.sleep(0.1)
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.communicate()
    deadline = time.monotonic() + 60
    while _sweep_processes(folder):  # the trials were told to stop when the sweep died
        assert time.monotonic() < deadline, _sweep_processes(folder)
        time.sleep(0.2)
    before = _summaries(folder)
    assert 1 <= len(before) < 4, "kill the sweep mid-way"

    resumed = run_command(agentenv_command("sweep", str(path)), timeout=300, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{len(before)} finished earlier, {4 - len(before)} to run" in resumed.stdout
    after = _summaries(folder)
    assert len(after) == 4
    assert all(after[name] == mtime for name, mtime in before.items()), "a trial was redone"

    trials = _read_csv(folder / "trials.csv")
    assert [(r["config"], r["seed"], r["status"]) for r in trials] == [
        (str(c), str(s), "finished") for s in (0, 1) for c in range(2)
    ]
    assert all(float(r["env_steps"]) >= 1024 for r in trials)
    # The second seed of a config fetches its programs from the sweep's compilation cache.
    assert all(int(r["compile_cache_hits"]) > 0 for r in trials[2:])
    configs = _read_csv(folder / "configs.csv")
    assert sorted(r["config"] for r in configs) == ["0", "1"]
    assert all(r["seeds"] == "2/2" for r in configs)
    iqms = [float(r["episode_return_mean_iqm"]) for r in configs]
    assert iqms == sorted(iqms, reverse=True)
    for row in configs:
        returns = [float(t["episode_return_mean"]) for t in trials if t["config"] == row["config"]]
        assert float(row["episode_return_mean_iqm"]) == pytest.approx(np.mean(returns), rel=1e-3)
        assert float(row["ci_low"]) <= float(row["episode_return_mean_iqm"])
    results = (folder / "results.md").read_text()
    assert "4 of 4 trials finished" in results and results.count("| finished |") == 4

    again = run_command(agentenv_command("sweep", str(path)), timeout=120, cwd=tmp_path)
    assert "4 finished earlier, 0 to run" in again.stdout and _summaries(folder) == after

    loaded = ae.load_sweep(folder)  # the tables as the Python API reads them back
    assert loaded.scores() == {
        c: [float(t["episode_return_mean"]) for t in trials if t["config"] == str(c)]
        for c in range(2)
    }
    assert [run.run_dir.name for run in loaded.runs(config=1)] == [
        t["trial"] for t in trials if t["config"] == "1"
    ]


@pytest.mark.slow
def test_mpiexec_trials_one_trial_at_a_time_and_a_changed_sweep(tmp_path):
    """ranks: 3 runs each trial as an mpiexec job; --trial K runs only trial K (a Slurm array
    task); --table rewrites the tables; a changed sweep does not resume into the old folder."""
    path = _sweep_file(
        tmp_path,
        name="jobs",
        set=TRIAL_BUDGET,
        parameters={"algorithm.clip_eps": [0.1, 0.2]},
        ranks=3,
    )
    folder = tmp_path / "runs" / "jobs"
    one = run_command(agentenv_command("sweep", str(path), "--trial", "1"), 240, tmp_path)
    assert one.returncode == 0, one.stdout + one.stderr
    assert list(_summaries(folder)) == ["c01-clip_eps=0.2-seed0"]
    summary = json.loads((folder / "trials/c01-clip_eps=0.2-seed0/summary.json").read_text())
    assert summary["topology"].startswith("1 learner + 2 env rank(s)")
    log = (folder / "logs/c01-clip_eps=0.2-seed0.log").read_text()
    assert "mpiexec -n 3" in log.splitlines()[0]
    rows = _read_csv(folder / "trials.csv")
    assert [r["status"] for r in rows] == ["pending", "finished"]

    table = run_command(agentenv_command("sweep", str(path), "--table"), 120, tmp_path)
    assert table.returncode == 0 and "results.md" in table.stdout

    changed = run_command(
        agentenv_command("sweep", str(path), *settings("algorithm.num_epochs=1")), 120, tmp_path
    )
    assert changed.returncode == 2
    assert "holds a sweep whose overrides differs" in changed.stderr
    assert list(_summaries(folder)) == ["c01-clip_eps=0.2-seed0"]

    bad = subprocess.run(
        agentenv_command("sweep", str(path), "--trial", "5"),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and "--trial 5 is not allowed" in bad.stderr


@pytest.mark.parametrize("name", sorted(shipped_sweeps()))
def test_every_shipped_sweep_builds_its_trials(name):
    spec = read_sweep(name)
    trials = expand(spec)
    check_trials(spec, trials)
    assert trials and len({t.name for t in trials}) == len(trials)
    if name.startswith("suite_"):  # a suite: 3 seeds at least, of one task or several games
        assert len(spec.seeds) >= 3 and all(key == "env.id" for key, _ in spec.parameters)


def test_a_sweep_begun_before_a_setting_existed_still_resumes(tmp_path):
    """A sweep folder records its base config; one written before a setting was added lacks
    it and ran with its default, so the same sweep is still the same sweep."""
    from agentenv_jax.workflow.sweeps.runner import prepare

    spec = read_sweep(_sweep_file(tmp_path, name="old", parameters={"algorithm.clip_eps": [0.1]}))
    prepare(spec)
    record = spec.folder / "sweep.yaml"
    earlier = yaml.safe_load(record.read_text())
    del earlier["base_config"]["network"]["torso"], earlier["base_config"]["env"]["backend"]
    record.write_text(yaml.safe_dump(earlier, sort_keys=False))
    assert prepare(spec) == expand(spec)
    earlier["base_config"]["network"]["activation"] = "relu"  # a real difference is refused
    record.write_text(yaml.safe_dump(earlier, sort_keys=False))
    with pytest.raises(ConfigError, match="holds a sweep whose base_config differs"):
        prepare(spec)


def _alias_bomb_lines(levels: int, indent: str) -> str:
    """A "billion laughs": `a{i}` is nine aliases of `a{i-1}`, so the last stands for
    9**levels strings in a few lines."""
    lines = [f"{indent}a0: &a0 [{', '.join(['lol'] * 9)}]"]
    lines += [f"{indent}a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_in_a_sweep_file_or_its_record_is_refused(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(
        "base: cartpole_ppo\nparameters:\n  env.kwargs:\n    - bomb:\n"
        + _alias_bomb_lines(9, indent="        ")
    )
    with pytest.raises(ConfigError, match=r"sweep file '.*bomb.yaml', line 12: aliases .* at most"):
        read_sweep(path)
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "trials.csv").write_text("trial,config,status\n")
    (folder / "configs.csv").write_text("config\n")
    (folder / "sweep.yaml").write_text("metric: episode_return_mean\n" + _alias_bomb_lines(9, ""))
    with pytest.raises(ConfigError, match=r"sweep record '.*sweep.yaml', line 9: aliases"):
        ae.load_sweep(folder)
    (folder / "sweep.yaml").write_text("metric: episode_return_mean\nname: sweep\n")
    assert ae.load_sweep(folder).metric == "episode_return_mean"


@pytest.mark.timeout(30, method="signal")  # blocking on the FIFO fails the test, not the run
def test_a_sweep_file_that_is_a_fifo_is_named_for_what_it_is(tmp_path):
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)  # nothing writes to it: reading it would wait for ever
    with pytest.raises(ConfigError, match=r"sweep file '.*pipe.yaml' is a FIFO, not a regular"):
        read_sweep(path)
