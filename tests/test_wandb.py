"""W&B logging (docs/wandb.md): without credentials the lead learner's run is an offline W&B run
in RUN_DIR/wandb holding the TensorBoard scalars at the same steps and the resolved config, read
back from its .wandb file; a resumed run continues it; without wandb, run.wandb=true does not
start."""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import agentenv_jax as ae
from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import config_to_dict
from agentenv_jax.metrics.wandb_logger import (
    RUN_ID_FILE,
    WandbLogger,
    has_credentials,
    resolve_mode,
)
from agentenv_jax.workflow.cli import main

from conftest import agentenv_command, mpi_launch, run_command, settings

# The TensorBoard test's budget: 4 updates of cartpole_ppo.
BUDGET = {"total_env_steps": 1024, "progress": False}
ALGORITHM = {"num_epochs": 2}

# A .wandb file is a LevelDB log (32 KiB blocks of chunks: crc32c, length, type) of protobuf
# `Record`s after a 7-byte header (":W&B", magic 0xBEE1, version).
_BLOCK = 32768
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_wandb_records(path: Path) -> list:
    """Every `wandb_internal_pb2.Record` of a .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    records, chunks, pos = [], [], 7
    while pos + _CHUNK_HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK_HEADER:  # a block's zero-filled tail
            pos += left
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        if kind == 0:  # zeros: the rest of the block is unused
            pos += left
            continue
        chunks.append(data[pos + _CHUNK_HEADER : pos + _CHUNK_HEADER + length])
        pos += _CHUNK_HEADER + length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            records.append(record)
            chunks = []
    return records


def offline_runs(run_dir: Path) -> list[Path]:
    """The offline W&B run folders of a run, oldest first."""
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def records_of(folder: Path, kind: str) -> list:
    (path,) = folder.glob("run-*.wandb")
    return [r for r in read_wandb_records(path) if r.WhichOneof("record_type") == kind]


def history(folder: Path) -> list[tuple[int, dict[str, float]]]:
    """(step, {scalar name: value}) of each logged step, without W&B's own `_` keys."""
    rows = []
    for record in records_of(folder, "history"):
        values = {}
        for item in record.history.item:
            key = item.key or "/".join(item.nested_key)
            if not key.startswith("_"):
                values[key] = json.loads(item.value_json)
        rows.append((record.history.step.num, values))
    return rows


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    """No W&B key, no mode, no netrc: a HOME of the test's own (auto mode must go offline)."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_DIR", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.slow
def test_offline_wandb_run_holds_the_tensorboard_scalars_and_the_config(tmp_path, no_credentials):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = ae.train(
        "cartpole_ppo",
        run={**BUDGET, "run_dir": str(tmp_path), "name": "wb", "tensorboard": True, "wandb": True},
        algorithm=ALGORITHM,
    )
    (folder,) = offline_runs(run.run_dir)  # offline: no credentials, so no network
    (start,) = records_of(folder, "run")
    assert start.run.display_name == "wb"
    assert start.run.project == "agentenv_jax"
    assert (run.run_dir / "wandb" / RUN_ID_FILE).read_text().strip() == start.run.run_id
    config = {u.key: u.value_json for u in start.run.config.update if u.key != "_wandb"}
    assert set(config) == set(config_to_dict(run.config))
    attached = json.loads(config["algorithm"])
    assert attached["learning_rate"] == run.config.algorithm.learning_rate
    assert attached["num_epochs"] == 2
    assert json.loads(config["run"])["name"] == "wb"

    rows = history(folder)
    steps = [r["env_steps"] for r in run.records]
    assert [step for step, _ in rows] == steps
    events = EventAccumulator(str(run.run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"episode_return_mean", "loss/policy", "time/learner_update_s"} <= tags
    assert set().union(*(values for _, values in rows)) == tags
    for tag in ("loss/policy", "loss/value", "approx_kl", "episode_return_mean"):
        logged = [values[tag] for _, values in rows]
        np.testing.assert_allclose(logged, [r[tag] for r in run.records], rtol=1e-6)
        tensorboard = [s.value for s in events.Scalars(tag)]
        np.testing.assert_allclose(logged, tensorboard, rtol=1e-6)
    updates = [values["time/learner_update_s"] for _, values in rows]
    np.testing.assert_allclose(updates, [t["time/learner_update_s"] for t in run.timings], 1e-6)
    (end,) = records_of(folder, "exit")  # finished, not left open
    assert end.exit.exit_code == 0


@pytest.mark.slow
def test_a_resumed_run_continues_its_wandb_run(tmp_path, no_credentials):
    """The resumed session is a second offline folder of the same W&B run id (`wandb sync`
    uploads them in order), its steps after the first session's."""
    first = ae.train(
        "cartpole_ppo",
        run={
            **BUDGET,
            "total_env_steps": 512,
            "run_dir": str(tmp_path),
            "name": "wb",
            "wandb": True,
        },
        algorithm=ALGORITHM,
    )
    resume = ["train", "--resume", str(first.run_dir), *settings("run.total_env_steps=1024")]
    assert main(resume) == 0
    run = ae.load_run(first.run_dir)
    folders = offline_runs(run.run_dir)
    assert len(folders) == 2
    (run_id,) = {records_of(folder, "run")[0].run.run_id for folder in folders}
    assert (run.run_dir / "wandb" / RUN_ID_FILE).read_text().strip() == run_id
    steps = [[step for step, _ in history(folder)] for folder in folders]
    assert steps[0] == [r["env_steps"] for r in first.records]
    assert steps[0] + steps[1] == [r["env_steps"] for r in run.records]
    assert steps[1][-1] == 1024


@pytest.mark.slow
def test_a_stopped_run_finishes_its_wandb_run(tmp_path, no_credentials):
    """A stop signal (SIGTERM, once 3 updates are written) ends training gracefully, and the
    W&B run is finished then, not by wandb's exit hook: it is checked while this process lives."""
    run_dir = tmp_path / "wb"

    def stop_after_three_updates() -> None:
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    stopper = threading.Thread(target=stop_after_three_updates, daemon=True)
    stopper.start()
    run = ae.train(
        "cartpole_ppo",
        run={**BUDGET, "total_env_steps": 10_000_000, "run_dir": str(tmp_path), "name": "wb"},
        overrides=["run.wandb=true"],
    )
    stopper.join()
    assert run.summary["interrupted"] and run.records[-1]["env_steps"] < 10_000_000
    (folder,) = offline_runs(run_dir)
    assert [step for step, _ in history(folder)] == [r["env_steps"] for r in run.records]
    (end,) = records_of(folder, "exit")
    assert end.exit.exit_code == 0


@pytest.mark.slow  # wandb starts its service process
def test_a_run_that_fails_is_finished_as_failed(tmp_path, no_credentials):
    """A logger closed while an error propagates (the drivers close it in `finally`) finishes
    its W&B run with exit code 1."""
    logger = WandbLogger(tmp_path, "wb", "agentenv_jax", "offline", {"run": {"seed": 0}})
    with pytest.raises(RuntimeError, match="the update failed"):
        try:
            logger.log({"loss/policy": 0.5}, step=256)
            raise RuntimeError("the update failed")
        finally:
            logger.close()
    (folder,) = offline_runs(tmp_path)
    # W&B's service process writes the run file on a thread of its own: the exit record is
    # the last one it writes, so the file is complete once it is there.
    deadline = time.monotonic() + 60
    while not records_of(folder, "exit") and time.monotonic() < deadline:
        time.sleep(0.1)
    (end,) = records_of(folder, "exit")
    assert end.exit.exit_code == 1
    assert history(folder) == [(256, {"loss/policy": 0.5})]


def test_credentials_decide_the_auto_mode(tmp_path):
    home = tmp_path
    assert resolve_mode("auto", {}, home) == "offline"
    assert resolve_mode("auto", {"WANDB_API_KEY": "k"}, home) == "online"
    assert resolve_mode("auto", {"WANDB_MODE": "disabled"}, home) == "disabled"
    assert resolve_mode("offline", {"WANDB_API_KEY": "k"}, home) == "offline"
    assert resolve_mode("online", {}, home) == "online"
    (home / ".netrc").write_text("machine example.org login user password secret\n")
    assert not has_credentials({}, home)
    (home / ".netrc").write_text("machine api.wandb.ai login user password secret\n")
    assert has_credentials({}, home)
    assert resolve_mode("auto", {}, home) == "online"
    # Another server's entry is the one that counts, and $NETRC names the file.
    assert not has_credentials({"WANDB_BASE_URL": "https://wandb.example.org"}, home)
    other = tmp_path / "other_netrc"
    other.write_text("machine wandb.example.org login user password secret\n")
    environ = {"WANDB_BASE_URL": "https://wandb.example.org", "NETRC": str(other)}
    assert has_credentials(environ, home)
    (home / ".netrc").write_text("machine api.wandb.ai login\n")  # unreadable to W&B too
    assert not has_credentials({}, home)


def test_wandb_without_wandb_does_not_start(tmp_path, monkeypatch, capsys):
    """Without the wandb extra, run.wandb=true is one clear error before anything runs."""
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    message = (
        "run.wandb = True is not allowed here: it needs wandb "
        "(pip install 'agentenv_jax[wandb]'), or set run.wandb=false"
    )
    with pytest.raises(ConfigError) as raised:
        ae.train("cartpole_ppo", run={**BUDGET, "run_dir": str(tmp_path), "wandb": True})
    assert str(raised.value) == message
    overrides = settings(f"run.run_dir={tmp_path}", "run.name=wb", "run.wandb=true")
    assert main(["train", "cartpole_ppo", *overrides]) == 2
    assert f"agentenv: error: {message}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [], "a refused run wrote its folder"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_wandb_without_wandb_stops_every_rank_before_training(tmp_path):
    """Under mpiexec the learner's refusal reaches the env rank at the start-up agreement:
    the job exits with the one error and no rank trains. A `wandb` package first on the path
    that raises ImportError stands in for a missing one (in every rank and its supervisor)."""
    shim = tmp_path / "shim" / "wandb"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('wandb is not installed')\n")
    path = os.pathsep.join(p for p in (str(shim.parent), os.environ.get("PYTHONPATH")) if p)
    runs = tmp_path / "runs"
    proc = run_command(
        [
            *mpi_launch(2),
            *agentenv_command(
                "train",
                "cartpole_ppo",
                *settings(
                    "run.wandb=true",
                    "run.total_env_steps=256",  # were it not refused, one update
                    "run.progress=false",
                    f"run.run_dir={runs}",
                    "run.name=wb",
                ),
            ),
        ],
        timeout=150,
        cwd=tmp_path,
        extra_env={"PYTHONPATH": path},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "rank 0: run.wandb = True is not allowed here: it needs wandb" in proc.stderr, (
        proc.stderr[-3000:]
    )
    assert "Traceback" not in proc.stderr
    assert not (runs / "wb").exists(), "the run started"
