"""Pacing replay sampling against inserting, as Reverb's sample-to-insert limiter does.

The learner samples only while `sampled <= samples_per_insert * (inserted - learning_starts)`
(plus one batch), and grants env ranks an insert allowance of
`learning_starts + sampled / samples_per_insert + slack`, so neither side runs away from the
ratio, and neither can deadlock the other (the slack is at least one batch's worth).
"""

from __future__ import annotations

import math


def insert_allowance(
    batch_size: int,
    samples_per_insert: float,
    sampled: int,
    global_num_envs: int,
    learning_starts: int,
) -> int:
    """Transitions env ranks may have inserted in total, given how many the learner sampled."""
    slack = 2 * global_num_envs + math.ceil(batch_size / samples_per_insert)
    return learning_starts + math.ceil(sampled / samples_per_insert) + slack


def may_sample(
    samples_per_insert: float, sampled: int, inserted: int, learning_starts: int
) -> bool:
    """Whether one more batch keeps sampling within the samples-per-insert ratio."""
    if inserted < learning_starts:
        return False
    return sampled <= samples_per_insert * (inserted - learning_starts) + 0.5
