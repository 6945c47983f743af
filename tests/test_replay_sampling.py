"""Sharded replay sampling under `mpiexec`, with one learner and with two: distribution, row
integrity, accounting."""

from __future__ import annotations

import json
import math
import sys

import pytest

from conftest import REPO, mpiexec_path, run_command

pytestmark = pytest.mark.slow  # every test here starts a process or trains

# Stored items per partition: the 6 envs split over 3 env ranks (one learner: 2, 2, 2; two
# learners: 3 envs each, env ranks 0 and 2 sharing learner 0's), so the capacities differ.
STORED = {1: [40, 100, 100], 2: [40, 120, 50]}


@pytest.mark.parametrize("learners", [1, 2])
def test_sharded_sampling_matches_global_priorities_and_reconciles(learners):
    proc = run_command(
        [
            mpiexec_path(),
            "-n",
            str(3 + learners),
            sys.executable,
            str(REPO / "tests" / "replay_sampling_job.py"),
            str(learners),
        ],
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result["learners"] == learners
    # Partitions of different fill (40, 120 and 260 steps; the last two may wrap their rings)
    # and priorities.
    assert result["stored_items"] == STORED[learners]
    assert result["drawn"] == result["draws"]  # every row drawn, by whichever learner
    # Chi-square over every stored item across all partitions: below the 99.99% quantile
    # (normal approximation, df + 3.72 sqrt(2 df)).
    df = result["df"]
    assert result["chi2"] < df + 3.72 * math.sqrt(2 * df), result["chi2"]
    assert result["never_stored"] == 0
    assert result["bad_rows"] == 0 and result["rows_checked"] > 50_000
    for report in result["reports"]:
        assert report["inserted"] == report["stored"] + report["overwritten"]
        assert report["produced"] == report["inserted"] + report["pending"]
        assert report["inserted"] > 0 and report["sampled"] > 0
    assert sum(r["overwritten"] for r in result["reports"]) > 0
    assert sum(r["priority_updates"] for r in result["reports"]) > 0
