"""Replay partition: ring accounting, n-step returns, priorities, and batch splitting."""

from __future__ import annotations

import numpy as np
import pytest

from agentenv_jax.buffers.replay import (
    ReplayPartition,
    draw_masses,
    importance_weights,
    split_batch,
    split_batch_by_learner,
)
from agentenv_jax.transport.messages import sample_answer_spec, sample_summary_spec


def make_partition(capacity=8, prioritized=True, n_step=1, gamma=0.5, num_envs=1):
    return ReplayPartition(
        capacity,
        (2,),
        1,
        prioritized=prioritized,
        alpha=0.6,
        n_step=n_step,
        gamma=gamma,
        num_envs=num_envs,
    )


def insert_items(part: ReplayPartition, count: int, start: int = 0) -> None:
    values = np.arange(start, start + count, dtype=np.float32)
    part.insert(
        np.stack([values, values], 1),
        values[:, None],
        values,
        np.stack([values] * 2, 1),
        np.full(count, 0.5, np.float32),
    )


def test_ring_overwrites_oldest_and_accounting_reconciles():
    part = make_partition(capacity=5)
    insert_items(part, 3)
    insert_items(part, 4, start=3)
    c = part.counters
    assert (c.inserted, c.overwritten, part.size) == (7, 2, 5)
    assert c.inserted == part.size + c.overwritten
    assert sorted(part.item_id.tolist()) == [2, 3, 4, 5, 6]  # items 0 and 1 were evicted
    for slot in range(5):
        assert part.reward[slot] == part.item_id[slot]


def test_n_step_returns_and_discounts_match_hand_computation():
    part = make_partition(capacity=16, prioritized=False, n_step=3, gamma=0.5)
    rewards = [1.0, 2.0, 4.0, 8.0]
    for t, r in enumerate(rewards):
        obs = np.array([[t, 0]], np.float32)
        part.add_step(
            obs, np.array([[0.0]]), np.array([r]), obs + 1, np.array([t == 3]), np.array([False])
        )
    # t=2 completes the first 3-step window; the terminal at t=3 flushes the rest.
    assert part.counters.inserted == 4 and part.pending == 0
    by_id = np.argsort(part.item_id[:4])
    np.testing.assert_allclose(part.reward[by_id], [1 + 1 + 1, 2 + 2 + 2, 4 + 4, 8])
    np.testing.assert_allclose(part.discount[by_id], [0.125, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(part.next_obs[by_id][:, 0], [3, 4, 4, 4])


def test_truncation_keeps_bootstrap_discount():
    part = make_partition(capacity=8, prioritized=False, n_step=2, gamma=0.9)
    obs = np.zeros((1, 2), np.float32)
    part.add_step(obs, np.zeros((1, 1)), np.array([1.0]), obs, np.array([False]), np.array([True]))
    assert part.discount[0] == pytest.approx(0.9)


def test_priorities_follow_td_errors_and_stale_updates_are_ignored():
    part = make_partition(capacity=4)
    insert_items(part, 4)
    batch = part.sample(6, np.random.default_rng(0))
    part.update_priorities(batch["slot"], batch["generation"], np.full(6, 3.0))
    assert part.max_priority == pytest.approx(3.0, rel=1e-5)
    insert_items(part, 4, start=4)  # every slot overwritten: old generations are stale
    part.update_priorities(batch["slot"], batch["generation"], np.zeros(6))
    assert part.counters.stale_priority_updates == 6
    # new items enter with the max priority
    np.testing.assert_allclose(part.tree[4:8], np.full(4, 3.0**0.6), rtol=1e-5)


def test_sampled_rows_are_consistent_items():
    part = make_partition(capacity=32)
    insert_items(part, 50)
    batch = part.sample(200, np.random.default_rng(1))
    assert np.all(batch["item_id"] >= 50 - 32) and np.all(batch["item_id"] < 50)
    np.testing.assert_array_equal(batch["reward"], batch["item_id"].astype(np.float32))


def test_importance_weights_hand_computed():
    # P = [0.5, 0.25], N = 4, beta = 1: w = 1/(4P) = [0.5, 1.0] -> normalized [0.5, 1]
    w = importance_weights(np.array([2.0, 1.0]), total_mass=4.0, num_items=4, beta=1.0)
    np.testing.assert_allclose(w, [0.5, 1.0])


def test_split_batch_is_multinomial_in_the_masses():
    rng = np.random.default_rng(2)
    counts = np.array([split_batch(64, np.array([1.0, 3.0, 0.0]), rng) for _ in range(2000)])
    assert np.all(counts.sum(1) == 64) and np.all(counts[:, 2] == 0)
    assert counts[:, 1].mean() == pytest.approx(48, rel=0.02)


def test_learners_each_draw_their_share_from_their_own_partitions():
    """Two learners of two partitions each: every draw gives each learner exactly half the
    batch, spread over its partitions by their masses; an item's draw probability is its
    mass over L times its learner's mass, which the weights use (checked on the empirical
    frequencies of one item per partition)."""
    masses = np.array([1.0, 3.0, 6.0, 2.0])
    rng = np.random.default_rng(5)
    counts = np.array(
        [split_batch_by_learner(64, masses, [2, 2], rng) for _ in range(4000)], np.float64
    )
    assert np.all(counts[:, :2].sum(1) == 32) and np.all(counts[:, 2:].sum(1) == 32)
    np.testing.assert_allclose(counts.mean(0), [8, 24, 24, 8], rtol=0.03)
    np.testing.assert_array_equal(draw_masses(masses, [2, 2]), [8.0, 8.0, 16.0, 16.0])
    # Per draw, a partition is drawn from with probability count / batch = its mass / draw mass.
    np.testing.assert_allclose(counts.mean(0) / 64, masses / draw_masses(masses, [2, 2]), rtol=0.03)
    # One learner: the global multinomial, as before.
    single = split_batch_by_learner(64, masses, [4], np.random.default_rng(5))
    np.testing.assert_array_equal(single, split_batch(64, masses, np.random.default_rng(5)))
    np.testing.assert_array_equal(draw_masses(masses, [4]), [12.0] * 4)


def test_weights_of_a_batch_drawn_in_parts_share_its_largest_weight():
    priorities, mass = np.array([2.0, 1.0, 4.0]), np.array([8.0, 8.0, 16.0])
    whole = importance_weights(priorities, mass, 10, beta=0.5)
    # Learner 0 holds the first two rows, learner 1 the last: each normalizes by the smallest
    # draw probability of the whole batch (here row 1's, 1/8), so the parts join up.
    smallest = float((priorities / mass).min())
    parts = np.concatenate(
        [
            importance_weights(priorities[:2], mass[:2], 10, 0.5, smallest),
            importance_weights(priorities[2:], mass[2:], 10, 0.5, smallest),
        ]
    )
    np.testing.assert_allclose(parts, whole, rtol=1e-6)
    np.testing.assert_allclose(whole, [(2 / 8 / (1 / 8)) ** -0.5, 1.0, (4 / 16 / (1 / 8)) ** -0.5])


def test_an_answers_first_bytes_are_its_summary():
    answer_spec = sample_answer_spec(64, (3,), 2)
    answer = answer_spec.allocate()
    views = answer_spec.views(answer)
    views["mass"][0], views["counters"][:] = 2.5, np.arange(len(views["counters"]))
    views["num_episodes"][0], views["episode_return"][0] = 1, 7.0
    summary_spec = sample_summary_spec()
    summary = summary_spec.views(answer[: summary_spec.nbytes].copy())
    assert summary["mass"][0] == 2.5 and summary["episode_return"][0] == 7.0
    np.testing.assert_array_equal(summary["counters"], views["counters"])
    assert summary_spec.nbytes < answer_spec.nbytes // 4  # the rows stay behind


def test_snapshot_restore_round_trip_keeps_items_priorities_and_ring_order():
    saved = make_partition(capacity=5)
    insert_items(saved, 7)  # wrapped: items 2..6 stored, the oldest in slot 2
    saved.update_priorities(np.array([3]), saved.generation[[3]], np.array([4.0]))  # item 3
    snapshot = saved.snapshot()
    np.testing.assert_array_equal(snapshot["reward"], [2, 3, 4, 5, 6])  # oldest first
    restored = make_partition(capacity=5)
    restored.restore([snapshot])
    assert (restored.size, restored.counters.restored, restored.counters.inserted) == (5, 5, 0)
    np.testing.assert_array_equal(restored.reward, [2, 3, 4, 5, 6])
    np.testing.assert_allclose(restored.snapshot()["priority"], snapshot["priority"])
    assert restored.mass == pytest.approx(saved.mass)
    assert restored.max_priority == saved.max_priority
    # New items overwrite the restored ones oldest first, and the accounting still closes.
    insert_items(restored, 2, start=100)
    np.testing.assert_array_equal(restored.reward, [100, 101, 4, 5, 6])
    c = restored.counters
    assert c.inserted + c.restored == restored.size + c.overwritten
    with pytest.raises(ValueError, match="empty"):
        restored.restore([snapshot])


def test_restore_keeps_the_newest_items_that_fit_and_checks_shapes():
    saved = make_partition(capacity=8, prioritized=False)
    insert_items(saved, 6)
    small = make_partition(capacity=4, prioritized=False)
    small.restore([saved.snapshot()])
    np.testing.assert_array_equal(small.reward, [2, 3, 4, 5])
    other = ReplayPartition(
        4, (3,), 1, prioritized=False, alpha=0.6, n_step=1, gamma=0.5, num_envs=1
    )
    with pytest.raises(ValueError, match="observations"):
        other.restore([saved.snapshot()])


def test_saved_partitions_spread_over_a_different_number_of_ranks(tmp_path):
    from agentenv_jax.checkpoint import replay_files

    saved = []
    for index in range(2):
        part = make_partition(capacity=6)
        insert_items(part, 5, start=10 * index)
        saved.append(part.snapshot())
    replay_files.save_partition(tmp_path, 7, 0, 2, saved[0])
    assert replay_files.complete_set(tmp_path, 7) is None  # partition 1 is still missing
    replay_files.save_partition(tmp_path, 7, 1, 2, saved[1])
    assert replay_files.complete_set(tmp_path, 7) == 2
    # Same rank count: each rank takes its own partition back.
    same = replay_files.load_share(tmp_path, 7, 2, 1, 2)
    np.testing.assert_array_equal(same[0]["reward"], saved[1]["reward"])
    # Three ranks: every item lands on exactly one of them.
    rewards = []
    for index in range(3):
        part = make_partition(capacity=6)
        part.restore(replay_files.load_share(tmp_path, 7, 2, index, 3))
        rewards += part.reward[: part.size].tolist()
    assert sorted(rewards) == sorted(np.concatenate([s["reward"] for s in saved]).tolist())
    # Sets whose checkpoint orbax has dropped go; newer ones (still being written) stay.
    replay_files.save_partition(tmp_path, 9, 0, 2, saved[0])
    replay_files.save_partition(tmp_path, 3, 0, 2, saved[0])
    replay_files.prune(tmp_path, {7})
    assert sorted(p.name for p in (tmp_path / "replay").iterdir()) == ["7", "9"]
