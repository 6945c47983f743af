"""Parameter sync from a learner to its env ranks (`transport/mpi/params.py`): the chunking of
large messages within MPI's int counts, and under `mpiexec` with 1, 3 and 7 env ranks, each
scheme (`broadcast`, `point_to_point`, whole and in 1000-byte chunks) delivering the same
bytes and versions to every env rank, the newest of several, and the stop's closing count."""

from __future__ import annotations

import json
import sys

import pytest

from agentenv_jax.transport.mpi.params import CHUNK_BYTES, chunk_bounds

from conftest import REPO, mpiexec_path, run_command

JOB = str(REPO / "tests" / "param_sync_job.py")
INT_MAX = 2**31 - 1  # MPI's count of bytes in one call


@pytest.mark.parametrize(
    "nbytes",
    [0, 1, CHUNK_BYTES, CHUNK_BYTES + 1, 2**31, 5 * 2**30 + 3, 135_000_000 * 4, 8 * 2**30],
)
def test_chunks_cover_a_message_in_order_each_within_an_mpi_count(nbytes):
    bounds = chunk_bounds(nbytes)
    assert bounds[0][0] == 0 and bounds[-1][1] == nbytes
    assert all(a == b for (_, a), (b, _) in zip(bounds[:-1], bounds[1:], strict=True))
    assert all(0 < stop - start <= CHUNK_BYTES for start, stop in bounds) or nbytes == 0
    assert max(stop - start for start, stop in bounds) <= INT_MAX
    assert len(bounds) == max(1, -(-nbytes // CHUNK_BYTES))


def test_five_gibibytes_and_three_bytes_are_five_whole_chunks_and_three_bytes():
    bounds = chunk_bounds(5 * 2**30 + 3)
    assert [stop - start for start, stop in bounds] == [2**30] * 5 + [3]
    assert chunk_bounds(10, limit=4) == [(0, 4), (4, 8), (8, 10)]
    with pytest.raises(ValueError, match="limit = 0"):
        chunk_bounds(10, limit=0)


@pytest.mark.slow
@pytest.mark.parametrize("env_ranks", [1, 3, 7])
def test_every_env_rank_receives_the_learners_bytes_and_versions(env_ranks):
    proc = run_command(
        [mpiexec_path(), "-n", str(1 + env_ranks), sys.executable, JOB], timeout=300, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    cases = json.loads(line[len("RESULT ") :])["cases"]
    assert [(c["scheme"], c["chunk_bytes"]) for c in cases] == [
        ("broadcast", CHUNK_BYTES),
        ("broadcast", 1000),
        ("point_to_point", 1000),
    ]
    for case in cases:
        # Every segment carried the SHA-256 of the very message of its version.
        assert case["mismatches"] == [], case
        # Three versions sent at once: every env rank went on with the newest.
        assert case["last_versions"] == [case["newest_version"]] * env_ranks, case
        # Each env rank took every message (a broadcast's closing one too) before stopping.
        assert case["params_received"] == [case["messages_sent"]] * env_ranks, case
        closing = 1 if case["scheme"] == "broadcast" else 0
        assert case["messages_sent"] == case["newest_version"] + 1 + closing, case
        assert case["late"] == 0
