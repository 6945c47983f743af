"""Running mean/variance statistics that merge exactly across ranks (Chan et al., 1979).

Statistics are `(count, mean, m2)` with `m2` the sum of squared deviations, as float64 numpy
arrays. Env ranks compute the statistics of what they saw in one segment; the learner merges
them into the global statistics and broadcasts those back, so every rank normalizes the same way.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class RunningStats(NamedTuple):
    count: float
    mean: np.ndarray  # float64 [D]
    m2: np.ndarray  # float64 [D]


def empty_stats(dim: int) -> RunningStats:
    return RunningStats(0.0, np.zeros(dim), np.zeros(dim))


def stats_of(batch: np.ndarray) -> RunningStats:
    """Statistics of `batch [N, D]`."""
    batch = np.asarray(batch, dtype=np.float64)
    if batch.shape[0] == 0:
        return empty_stats(batch.shape[1])
    mean = batch.mean(axis=0)
    return RunningStats(float(batch.shape[0]), mean, ((batch - mean) ** 2).sum(axis=0))


def merge_stats(a: RunningStats, b: RunningStats) -> RunningStats:
    """Statistics of the union of the samples behind `a` and `b`."""
    count = a.count + b.count
    if count == 0:
        return a
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.count / count)
    m2 = a.m2 + b.m2 + delta**2 * (a.count * b.count / count)
    return RunningStats(count, mean, m2)


def stats_to_flat(stats: RunningStats) -> np.ndarray:
    """`[count, mean..., m2...]` as float64 `[1 + 2D]`: the form statistics take in messages."""
    return np.concatenate([[stats.count], stats.mean, stats.m2])


def stats_from_flat(flat: np.ndarray, dim: int) -> RunningStats:
    """The inverse of `stats_to_flat` (the arrays are views of `flat`)."""
    return RunningStats(float(flat[0]), flat[1 : 1 + dim], flat[1 + dim :])


def variance(stats: RunningStats) -> np.ndarray:
    """Population variance; 1 where nothing has been seen yet."""
    if stats.count < 2:
        return np.ones_like(stats.mean)
    return stats.m2 / stats.count


def normalize(x: np.ndarray, stats: RunningStats, clip: float, eps: float = 1e-8) -> np.ndarray:
    """`clip((x - mean) / sqrt(var + eps))` as float32; `x` is `[..., D]`."""
    scaled = (x - stats.mean) / np.sqrt(variance(stats) + eps)
    return np.clip(scaled, -clip, clip).astype(np.float32)


def normalize_observations(obs: np.ndarray, stats: RunningStats, clip: float) -> np.ndarray:
    """`normalize` of a batch of observations `[N, ...]` of any shape, as float32 `[N, ...]`."""
    flat = obs.reshape(obs.shape[0], -1)
    return normalize(flat, stats, clip).reshape(obs.shape)


def scale(x: np.ndarray, stats: RunningStats, clip: float, eps: float = 1e-8) -> np.ndarray:
    """`clip(x / sqrt(var + eps))` as float32: reward scaling by the return's std (no centering)."""
    scaled = x / np.sqrt(variance(stats)[0] + eps)
    return np.clip(scaled, -clip, clip).astype(np.float32)
