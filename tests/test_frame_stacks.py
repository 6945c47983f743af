"""Frame stacks sent once per frame (`buffers.frame_stacks`): the learner's gather against a
row-by-row stacking written here, and a round's segments joined along the env axis."""

from __future__ import annotations

import numpy as np
import pytest

from agentenv_jax.buffers.frame_stacks import restack, restacked_rollout


def stack_row_by_row(frames: np.ndarray, head: np.ndarray, restart: np.ndarray) -> np.ndarray:
    """Each row: the last k - 1 frames of the row before (of `head` before row 0) and this
    row's frame; where a row restarts, its frame k times."""
    k = head.shape[-1] + 1
    stacks, older = [], head
    for t in range(len(frames)):
        row = np.concatenate([older, frames[t][..., None]], axis=-1)
        for e in np.flatnonzero(restart[t]):
            row[e] = frames[t, e][..., None]
        stacks.append(row)
        older = row[..., 1:]
        assert row.shape[-1] == k
    return np.stack(stacks)


@pytest.mark.parametrize("seed", range(6))
def test_restack_is_row_by_row_stacking(seed):
    """Random segment shapes, stack sizes and restarts (row 0 and back-to-back ones too)."""
    rng = np.random.default_rng(seed)
    steps, envs, k = int(rng.integers(1, 30)), int(rng.integers(1, 5)), int(rng.integers(2, 6))
    frames = rng.integers(0, 256, (steps, envs, 3, 2), dtype=np.uint8)
    head = rng.integers(0, 256, (envs, 3, 2, k - 1), dtype=np.uint8)
    restart = rng.random((steps, envs)) < 0.25
    if steps > 2:
        restart[0, 0] = restart[1, 0] = restart[2, 0] = True
    np.testing.assert_array_equal(
        restack(frames, head, restart), stack_row_by_row(frames, head, restart)
    )


def test_a_rounds_segments_are_stacked_into_one_rollout():
    rng = np.random.default_rng(7)
    segments = []
    for envs in (3, 1, 2):
        segments.append(
            {
                "obs_frame": rng.integers(0, 256, (9, envs, 4, 4), dtype=np.uint8),
                "obs_head": rng.integers(0, 256, (envs, 4, 4, 3), dtype=np.uint8),
                "obs_restart": (rng.random((9, envs)) < 0.2).astype(np.uint8),
            }
        )
    expected = np.concatenate(
        [restack(s["obs_frame"], s["obs_head"], s["obs_restart"]) for s in segments], axis=1
    )
    np.testing.assert_array_equal(restacked_rollout(segments), expected)
