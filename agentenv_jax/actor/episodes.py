"""Episode returns and lengths of a rollout segment, computed once from its `[T, E]` arrays
(pure numpy: the env-rank loop calls it once per segment instead of once per vector step)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class EpisodeStatistics(NamedTuple):
    """What `episode_statistics` returns for one segment of `T` vector steps of `E` envs."""

    episode_return: np.ndarray  # float64 [T, E]: an episode's return where it finished, else NaN
    episode_length: np.ndarray  # int64 [T, E]: its valid steps where it finished, else 0
    next_return: np.ndarray  # float64 [E]: the running episode's return after the segment
    next_length: np.ndarray  # int64 [E]: and its length


def episode_statistics(
    rewards: np.ndarray,
    valid: np.ndarray,
    ended: np.ndarray,
    start_return: np.ndarray,
    start_length: np.ndarray,
) -> EpisodeStatistics:
    """Returns and lengths of the episodes that finished in a segment, computed once from its
    `[T, E]` arrays, bit for bit as the per-step recursion would: for each step `t`,
    `return += where(valid, reward, 0); length += valid`, an episode finishes where `ended & valid`
    and both restart from 0 after every `ended` step.

    `rewards` float `[T, E]` (raw, unscaled), `valid` bool `[T, E]` (False on auto-reset padding
    and faulted rows), `ended` bool `[T, E]` (the step ended its env's episode: terminated,
    truncated or faulted; a faulted episode restarts without being reported), `start_return`
    float64 `[E]` and `start_length` int64 `[E]`: the episodes running when the segment started.

    Each episode's stretch of the segment (a "piece") becomes one column of a `[L + 1, P]` matrix,
    its start value in row 0 and its steps below; `cumsum` down the columns then adds each
    piece's rewards one after another in time order, so the float sums equal the recursion's.
    `L` is the longest piece and `P = E + ended.sum()`: at most `(T + 1) * E * (T + 1)` entries
    (one env runs through the segment while the others end at every step), at most about
    `2 T E` when episodes have similar lengths.
    """
    num_steps, num_envs = rewards.shape
    step = np.arange(num_steps)[:, None]
    # The row where each step's piece begins: the row after its env's last end before it.
    begins = np.zeros((num_steps, num_envs), dtype=np.int64)
    begins[1:] = np.maximum.accumulate(np.where(ended[:-1], step[1:], 0), axis=0)
    position = step - begins  # [T, E]: the step's row within its piece
    ends_before = np.cumsum(ended, axis=0) - ended  # [T, E]: its piece's index within its env
    pieces = ends_before[-1] + 1  # [E]
    first_piece = np.cumsum(pieces) - pieces  # [E]: pieces are numbered env by env
    piece = first_piece + ends_before  # [T, E]
    rows = int(position.max()) + 2

    returns = np.zeros((rows, int(pieces.sum())))
    returns[0, first_piece] = start_return
    returns[position + 1, piece] = np.where(valid, rewards, 0.0)
    running_return = np.cumsum(returns, axis=0)[position + 1, piece]
    lengths = np.zeros(returns.shape, dtype=np.int64)
    lengths[0, first_piece] = start_length
    lengths[position + 1, piece] = valid
    running_length = np.cumsum(lengths, axis=0)[position + 1, piece]

    finished = ended & valid
    return EpisodeStatistics(
        np.where(finished, running_return, np.nan),
        np.where(finished, running_length, 0),
        np.where(ended[-1], 0.0, running_return[-1]),
        np.where(ended[-1], 0, running_length[-1]),
    )
