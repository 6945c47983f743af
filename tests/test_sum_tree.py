"""Sum-tree maths against a brute-force reference, and sampling frequencies (chi-square)."""

from __future__ import annotations

import numpy as np
import pytest

from agentenv_jax.buffers import sum_tree


def chi_square_statistic(counts: np.ndarray, expected: np.ndarray) -> float:
    return float(np.sum((counts - expected) ** 2 / expected))


# Upper 0.999 quantiles of the chi-square distribution, from tables (df: value).
CHI2_999 = {9: 27.877, 15: 37.697, 99: 148.230}


@pytest.mark.parametrize("capacity", [1, 2, 5, 16, 100])
def test_updates_and_totals_match_brute_force(capacity):
    rng = np.random.default_rng(capacity)
    tree = sum_tree.make_sum_tree(capacity)
    reference = np.zeros(capacity)
    for _ in range(50):
        k = int(rng.integers(1, capacity + 1))
        indices = rng.integers(0, capacity, size=k)
        priorities = rng.random(k) * 10
        sum_tree.update(tree, indices, priorities)
        for i, p in zip(indices, priorities, strict=True):
            reference[i] = p  # the last write of a repeated index wins
        assert sum_tree.total(tree) == pytest.approx(reference.sum(), rel=1e-12)
        np.testing.assert_allclose(sum_tree.leaf_priorities(tree, np.arange(capacity)), reference)
        # every internal node is the sum of its children
        size = tree.shape[0] // 2
        internal = np.arange(1, size)
        np.testing.assert_allclose(tree[internal], tree[2 * internal] + tree[2 * internal + 1])


def test_find_matches_prefix_sum_search():
    rng = np.random.default_rng(0)
    priorities = rng.random(37) * (rng.random(37) > 0.3)  # some zero priorities
    tree = sum_tree.make_sum_tree(37)
    sum_tree.update(tree, np.arange(37), priorities)
    targets = rng.random(5000) * priorities.sum()
    expected = np.searchsorted(np.cumsum(priorities), targets, side="right")
    np.testing.assert_array_equal(sum_tree.find(tree, targets), expected)
    assert np.all(priorities[sum_tree.find(tree, targets)] > 0)


@pytest.mark.parametrize("capacity, seed", [(10, 0), (16, 1), (100, 2)])
def test_sampling_frequencies_match_priorities_chi_square(capacity, seed):
    rng = np.random.default_rng(seed)
    priorities = rng.random(capacity) + 0.05
    tree = sum_tree.make_sum_tree(capacity)
    sum_tree.update(tree, np.arange(capacity), priorities)
    draws = 200_000
    counts = np.bincount(sum_tree.sample(tree, draws, rng), minlength=capacity)
    expected = draws * priorities / priorities.sum()
    assert chi_square_statistic(counts, expected) < CHI2_999[capacity - 1]


def test_zero_priority_items_are_never_sampled_and_empty_tree_is_an_error():
    tree = sum_tree.make_sum_tree(8)
    with pytest.raises(ValueError, match="total priority is 0"):
        sum_tree.sample(tree, 1, np.random.default_rng(0))
    sum_tree.update(tree, np.array([3, 5]), np.array([1.0, 3.0]))
    drawn = sum_tree.sample(tree, 10_000, np.random.default_rng(1))
    assert set(np.unique(drawn)) == {3, 5}
    assert abs(np.mean(drawn == 5) - 0.75) < 0.02
    with pytest.raises(ValueError, match="finite and >= 0"):
        sum_tree.update(tree, np.array([0]), np.array([-1.0]))
