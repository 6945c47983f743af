"""Sum-tree maths for prioritized sampling, as functions over an explicit numpy array.

The tree for `capacity` leaves (rounded up to a power of two, `size`) is one float64 array of
`2 * size` nodes: node 1 is the root, node `i` has children `2i` and `2i + 1`, and leaf `j` is
node `size + j`. Node 0 is unused. Every function takes the array and returns results; updates
write into it in place (the array *is* the state), so a partition owns exactly one allocation.
"""

from __future__ import annotations

import numpy as np


def tree_size(capacity: int) -> int:
    """Leaves in the tree: the smallest power of two >= capacity."""
    return 1 << max(0, int(capacity - 1).bit_length())


def make_sum_tree(capacity: int) -> np.ndarray:
    """A zeroed tree with room for `capacity` priorities."""
    return np.zeros(2 * tree_size(capacity), dtype=np.float64)


def total(tree: np.ndarray) -> float:
    """The sum of all priorities."""
    return float(tree[1])


def leaf_priorities(tree: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """The priorities stored at leaf `indices`."""
    return tree[tree.shape[0] // 2 + np.asarray(indices)]


def update(tree: np.ndarray, indices: np.ndarray, priorities: np.ndarray) -> None:
    """Set leaf `indices` to `priorities` (>= 0) and repair every ancestor's sum.

    With repeated indices the last priority wins. Cost: O(k log capacity) for k indices.
    """
    indices = np.asarray(indices, dtype=np.int64)
    priorities = np.asarray(priorities, dtype=np.float64)
    if np.any(priorities < 0) or not np.all(np.isfinite(priorities)):
        raise ValueError("priorities must be finite and >= 0")
    size = tree.shape[0] // 2
    nodes = size + indices
    tree[nodes] = priorities
    # Parents level by level; sorted unique once, then halving keeps them sorted, so only
    # adjacent duplicates need dropping.
    nodes = np.unique(nodes) // 2
    while nodes.size and nodes[0] >= 1:
        nodes = nodes[np.concatenate(([True], nodes[1:] != nodes[:-1]))]
        tree[nodes] = tree[2 * nodes] + tree[2 * nodes + 1]
        if nodes[0] == 1:
            break
        nodes = nodes // 2


def find(tree: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """For each target mass in `[0, total)`, the leaf whose prefix-sum interval holds it.

    Leaf `j` is returned for targets in `[sum(p[:j]), sum(p[:j+1]))`, so a uniform target draws
    leaf `j` with probability `p[j] / total`. Zero-priority leaves are never returned.
    """
    targets = np.array(targets, dtype=np.float64)
    size = tree.shape[0] // 2
    nodes = np.ones(targets.shape, dtype=np.int64)
    while size > 1:
        left = 2 * nodes
        go_right = targets >= tree[left]
        # Float round-off can leave a target just past a subtree's mass: never step into an
        # empty right child.
        go_right &= tree[left + 1] > 0
        targets = np.where(go_right, targets - tree[left], targets)
        nodes = np.where(go_right, left + 1, left)
        size //= 2
    return nodes - tree.shape[0] // 2


def sample(tree: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` leaf indices drawn i.i.d. with probability proportional to priority."""
    mass = total(tree)
    if mass <= 0:
        raise ValueError("cannot sample from a sum tree whose total priority is 0")
    return find(tree, rng.random(count) * mass)
