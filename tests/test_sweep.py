"""Sweeps: the sweep file and its trials (pure), the results statistics, and real sweeps of
`agentenv train` processes and mpiexec jobs that are killed and resumed."""

from __future__ import annotations

import csv
import json
import os
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
from agentenv_jax.sweeps.results import interquartile_means, trial_folder
from agentenv_jax.sweeps.runner import SweepRunner, _Running, progress_heads
from agentenv_jax.sweeps.spec import check_trials, expand, read_sweep

from conftest import agentenv_command, run_command, settings, start_job

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
        if str(folder) in cmdline and "agentenv_jax.cli" in cmdline:
            found.append(cmdline)
    return found


def test_grid_sweep_is_killed_resumed_and_tabled(tmp_path):
    """A 2x2 grid with 2 seeds, two trials at a time: SIGKILL the sweep once some trials have
    finished; its trials stop with it; the same command resumes without redoing the finished
    ones, and the tables have a row per trial and per config."""
    path = _sweep_file(
        tmp_path,
        name="grid",
        set=TRIAL_BUDGET,
        parameters={"algorithm.learning_rate": [1e-3, 3e-4], "algorithm.clip_eps": [0.1, 0.2]},
        seeds=2,
        parallel=2,
    )
    folder = tmp_path / "runs" / "grid"
    sweep = start_job(agentenv_command("sweep", str(path)), cwd=tmp_path)
    deadline = time.monotonic() + 240
    while len(_summaries(folder)) < 3:
        assert sweep.poll() is None, sweep.communicate()
        assert time.monotonic() < deadline, "the sweep finished no 3 trials in time"
        time.sleep(0.1)
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.communicate()
    deadline = time.monotonic() + 60
    while _sweep_processes(folder):  # the trials were told to stop when the sweep died
        assert time.monotonic() < deadline, _sweep_processes(folder)
        time.sleep(0.2)
    before = _summaries(folder)
    assert 3 <= len(before) < 8, "kill the sweep mid-way"

    resumed = run_command(agentenv_command("sweep", str(path)), timeout=300, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{len(before)} finished earlier, {8 - len(before)} to run" in resumed.stdout
    after = _summaries(folder)
    assert len(after) == 8
    assert all(after[name] == mtime for name, mtime in before.items()), "a trial was redone"

    trials = _read_csv(folder / "trials.csv")
    assert [(r["config"], r["seed"], r["status"]) for r in trials] == [
        (str(c), str(s), "finished") for s in (0, 1) for c in range(4)
    ]
    assert all(float(r["env_steps"]) >= 1024 for r in trials)
    # The second seed of a config fetches its programs from the sweep's compilation cache.
    assert all(int(r["compile_cache_hits"]) > 0 for r in trials[4:])
    configs = _read_csv(folder / "configs.csv")
    assert sorted(r["config"] for r in configs) == ["0", "1", "2", "3"]
    assert all(r["seeds"] == "2/2" for r in configs)
    iqms = [float(r["episode_return_mean_iqm"]) for r in configs]
    assert iqms == sorted(iqms, reverse=True)
    for row in configs:
        returns = [float(t["episode_return_mean"]) for t in trials if t["config"] == row["config"]]
        assert float(row["episode_return_mean_iqm"]) == pytest.approx(np.mean(returns), rel=1e-3)
        assert float(row["ci_low"]) <= float(row["episode_return_mean_iqm"])
    results = (folder / "results.md").read_text()
    assert "8 of 8 trials finished" in results and results.count("| finished |") == 8

    again = run_command(agentenv_command("sweep", str(path)), timeout=120, cwd=tmp_path)
    assert "8 finished earlier, 0 to run" in again.stdout and _summaries(folder) == after

    loaded = ae.load_sweep(folder)  # the tables as the Python API reads them back
    assert loaded.scores() == {
        c: [float(t["episode_return_mean"]) for t in trials if t["config"] == str(c)]
        for c in range(4)
    }
    assert [run.run_dir.name for run in loaded.runs(config=2)] == [
        t["trial"] for t in trials if t["config"] == "2"
    ]


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
    if name.startswith("suite_"):  # the standard suite is measured over at least 3 seeds
        assert len(spec.seeds) >= 3 and not spec.parameters


def test_a_sweep_begun_before_a_setting_existed_still_resumes(tmp_path):
    """A sweep folder records its base config; one written before a setting was added lacks
    it and ran with its default, so the same sweep is still the same sweep."""
    from agentenv_jax.sweeps.runner import prepare

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
