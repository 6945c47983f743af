"""TensorBoard event files beside metrics.jsonl hold the same numbers, read back with
TensorBoard's own reader."""

from __future__ import annotations

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import agentenv_jax as ae

pytestmark = pytest.mark.slow  # every test here starts a process or trains


def test_tensorboard_events_hold_the_metrics_and_timings(tmp_path):
    run = ae.train(
        "cartpole_ppo",
        run={
            "total_env_steps": 1024,
            "run_dir": str(tmp_path),
            "name": "tb",
            "progress": False,
            "tensorboard": True,
        },
        algorithm={"num_epochs": 2},
    )
    events = EventAccumulator(str(run.run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"episode_return_mean", "loss/policy", "approx_kl", "time/learner_update_s"} <= tags
    steps = [r["env_steps"] for r in run.records]
    for tag in ("loss/policy", "loss/value", "approx_kl", "episode_return_mean"):
        scalars = events.Scalars(tag)
        assert [s.step for s in scalars] == steps, tag
        expected = [r[tag] for r in run.records]
        np.testing.assert_allclose([s.value for s in scalars], expected, rtol=1e-6)
    updates = [s.value for s in events.Scalars("time/learner_update_s")]
    np.testing.assert_allclose(updates, [t["time/learner_update_s"] for t in run.timings], 1e-6)


def test_tensorboard_is_off_by_default(tmp_path):
    run = ae.train(
        "cartpole_ppo", run={"total_env_steps": 256, "run_dir": str(tmp_path), "progress": False}
    )
    assert not (run.run_dir / "tensorboard").exists()
