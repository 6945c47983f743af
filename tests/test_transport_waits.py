"""The transport's hot path: message views, the MPI waits' spin-then-back-off, and segments
streamed as fast as the on-policy channels go (order, accounting, stop) under `mpiexec -n 3`."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from agentenv_jax.transport.spec import FieldSpec, MessageSpec

from conftest import REPO, mpiexec_path, run_command

JOB = str(REPO / "tests" / "transport_stream_job.py")


def job_result(args: list[str], timeout: float) -> dict:
    proc = run_command(args, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_views_are_each_field_at_its_offset():
    fields = [
        FieldSpec("scalar", (), np.float64),
        FieldSpec("one", (1,), np.int64),
        FieldSpec("empty", (0, 3), np.float32),
        FieldSpec("image", (2, 3, 3), np.uint8),  # 18 bytes, padded to 24
        FieldSpec("flags", (5,), np.uint8),
        FieldSpec("last", (2, 2), np.int32),
    ]
    spec = MessageSpec(fields)
    assert spec.nbytes == 64
    buffer = spec.allocate()
    views = spec.views(buffer)
    assert list(views) == [f.name for f in fields]
    for field, offset in zip(fields, [0, 8, 16, 16, 40, 48], strict=True):
        view = views[field.name]
        assert (view.shape, view.dtype) == (field.shape, field.dtype)
        assert view.flags.writeable and view.flags.c_contiguous
        if view.size:
            assert view.ctypes.data - buffer.ctypes.data == offset
            assert np.shares_memory(view, buffer)
    views["scalar"][...] = 2.5
    views["last"][1, 0] = -7
    assert buffer[:8].view(np.float64)[0] == 2.5
    assert buffer[48:].view(np.int32).tolist() == [0, 0, -7, 0]


@pytest.mark.slow
def test_waits_spin_before_sleeping_then_back_off_to_their_cap():
    result = job_result([sys.executable, JOB, "backoff"], timeout=120)
    # No sleep while a wait is young, whether its message comes or not; after a reset too.
    assert result["slept_while_spinning"] == []
    assert result["slept_after_reset"] == []
    assert result["wait_within_spin_slept"] == []
    assert result["slept_after_spin"] == [20e-6, 40e-6, 80e-6, 160e-6, 250e-6, 250e-6]
    # A short wait keeps the fixed cap; longer ones sleep up to 1 % of the time waited (so a
    # message is seen at most ~1 % late), and never longer than 20 ms.
    assert result["longest_sleep_0.02"] == 250e-6
    assert 250e-6 < result["longest_sleep_1"] <= 0.01
    assert result["longest_sleep_60"] == 0.02
    for timeout_s in ("1", "60"):
        assert 0.0 < result[f"late_share_{timeout_s}"] <= 0.0101
        assert result[f"waited_{timeout_s}"] < float(timeout_s) * 1.011 + 0.02
    assert "timed out after 60 s waiting for the test's message" in result["timeout_error"]


@pytest.mark.slow
def test_segments_stream_in_order_and_reconcile_at_every_credit_count():
    result = job_result([mpiexec_path(), "-n", "3", sys.executable, JOB, "stream"], timeout=300)
    assert [case["credits"] for case in result["cases"]] == [1, 2, 8]
    for case in result["cases"]:
        assert case["out_of_order"] == 0 and case["late"] == 0
        for received, report in zip(case["received"], case["reports"], strict=True):
            assert report["produced"] == 400
            assert received == report["sent_transitions"] == report["expected_transitions"]
            assert report["last_version"] == 400
