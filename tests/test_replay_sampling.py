"""Sharded replay sampling under `mpiexec -n 4`: distribution, row integrity, accounting."""

from __future__ import annotations

import json
import math
import sys

from conftest import REPO, mpiexec_path, run_command


def test_sharded_sampling_matches_global_priorities_and_reconciles():
    proc = run_command(
        [mpiexec_path(), "-n", "4", sys.executable, str(REPO / "tests" / "replay_sampling_job.py")],
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    # Partitions of different fill (40, 100 of 120, 100 of 260 steps) and priorities.
    assert result["stored_items"] == [40, 100, 100]
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
