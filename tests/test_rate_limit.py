"""The sample-to-insert limiter as plain functions."""

from __future__ import annotations

from agentenv_jax.learner.rate_limit import insert_allowance, may_sample


def test_no_sampling_before_learning_starts_then_at_most_the_ratio():
    assert not may_sample(4.0, sampled=0, inserted=99, learning_starts=100)
    assert may_sample(4.0, sampled=0, inserted=100, learning_starts=100)
    # 10 inserted past the start allow 40 sampled; the 41st would break the ratio.
    assert may_sample(4.0, sampled=40, inserted=110, learning_starts=100)
    assert not may_sample(4.0, sampled=41, inserted=110, learning_starts=100)


def test_insert_allowance_keeps_env_ranks_a_batch_ahead_of_the_learner():
    # 256 sampled at 4 per insert is 64 inserts past the start, plus 2 per env and one batch.
    allowance = insert_allowance(32, 4.0, sampled=256, global_num_envs=8, learning_starts=100)
    assert allowance == 100 + 64 + 16 + 8
    # The allowance always lets the learner's next batch become sampleable: no deadlock.
    inserted = allowance
    assert may_sample(4.0, sampled=256 + 32, inserted=inserted, learning_starts=100)
