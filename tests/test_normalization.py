"""Running statistics merge exactly: ranks' partial statistics equal the statistics of the union."""

from __future__ import annotations

import numpy as np

from agentenv_jax.envs import normalization as norm


def test_merging_partial_statistics_equals_statistics_of_the_union():
    rng = np.random.default_rng(5)
    parts = [rng.normal(loc=i, scale=1 + i, size=(n, 3)) for i, n in enumerate((7, 1, 30, 0))]
    merged = norm.empty_stats(3)
    for part in parts:
        merged = norm.merge_stats(merged, norm.stats_of(part))
    union = np.concatenate(parts)
    assert merged.count == len(union)
    np.testing.assert_allclose(merged.mean, union.mean(0), rtol=1e-12)
    np.testing.assert_allclose(norm.variance(merged), union.var(0), rtol=1e-12)


def test_normalize_and_scale_clip_and_default_to_identity_when_empty():
    empty = norm.empty_stats(2)
    x = np.array([[0.5, -20.0]])
    np.testing.assert_allclose(norm.normalize(x, empty, clip=10.0), [[0.5, -10.0]], rtol=1e-6)
    stats = norm.stats_of(np.array([[0.0], [2.0]]))  # mean 1, var 1
    np.testing.assert_allclose(norm.normalize(np.array([[3.0]]), stats, 10.0), [[2.0]], rtol=1e-6)
    np.testing.assert_allclose(norm.scale(np.array([[3.0]]), stats, 10.0), [[3.0]], rtol=1e-6)
