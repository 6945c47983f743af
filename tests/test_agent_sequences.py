"""Recorded model calls become training sequences: calls that resend the history make one
sequence with exactly their completions trainable; an edited or truncated history starts a
new one."""

from __future__ import annotations

import pytest

from agentenv_jax.envs.agent.sequences import ModelCall, join_calls


def call(prompt, completion, first_logprob=-0.5):
    logprobs = tuple(first_logprob - i for i in range(len(completion)))
    return ModelCall(tuple(prompt), tuple(completion), logprobs)


def test_calls_that_resend_the_history_make_one_sequence():
    first = call([1, 2, 3], [10, 11])
    # The next prompt: the first prompt, its completion, then a tool turn (20, 21, 22).
    second = call([1, 2, 3, 10, 11, 20, 21, 22], [12, 13, 14], first_logprob=-1.0)
    third = call([1, 2, 3, 10, 11, 20, 21, 22, 12, 13, 14, 30], [15], first_logprob=-2.0)
    (sequence,) = join_calls([first, second, third])
    assert sequence.tokens == (1, 2, 3, 10, 11, 20, 21, 22, 12, 13, 14, 30, 15)
    sampled = [t for t, keep in zip(sequence.tokens, sequence.trainable, strict=True) if keep]
    assert sampled == [10, 11, 12, 13, 14, 15]
    assert sequence.logprobs == (0, 0, 0, -0.5, -1.5, 0, 0, 0, -1.0, -2.0, -3.0, 0, -2.0)
    assert sequence.prompt_length == 3 and sequence.calls == 3


def test_an_edited_or_truncated_history_starts_a_new_sequence():
    first = call([1, 2, 3], [10, 11])
    edited = call([1, 2, 4, 10, 11], [12])  # the agent rewrote an earlier turn
    truncated = call([1, 2], [13])  # ...then dropped most of its history
    resumed = call([1, 2, 13, 40], [14])  # and went on from the truncated one
    sequences = join_calls([first, edited, truncated, resumed])
    assert [s.tokens for s in sequences] == [
        (1, 2, 3, 10, 11),
        (1, 2, 4, 10, 11, 12),
        (1, 2, 13, 40, 14),
    ]
    assert [s.calls for s in sequences] == [1, 1, 2]
    assert sequences[1].trainable == (False,) * 5 + (True,)
    assert sum(sum(s.trainable) for s in sequences) == 5  # every sampled token, once


def test_no_calls_no_sequences_and_mismatched_logprobs_are_refused():
    assert join_calls([]) == []
    with pytest.raises(ValueError, match="2 completion ids but 1 log-probs"):
        ModelCall((1,), (2, 3), (-0.1,))
