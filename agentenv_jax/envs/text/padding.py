"""Trimming text envs' token arrays of padding (`algorithm.length_bucket`): contexts are
left-padded and answers right-padded to the configured lengths, and a batch of short prompts
and short answers (a 43-token chat prompt in 64, a 3-token answer in 16) would otherwise be
generated from and trained on mostly padding. The columns cut are padding in every row, which
no output depends on (positions count from a row's first token)."""

from __future__ import annotations

import heapq

import numpy as np


def message_lengths(actions: np.ndarray, eos_id: int, pad_id: int) -> np.ndarray:
    """`int32 [...]`: each message's tokens in `actions` `[..., M]`: up to and including its
    first EOS; without one, up to its first `pad_id` (generation stopped the row at its token
    limit, `max_new_tokens`, and the policy never samples PAD); all M without either."""
    is_eos = actions == eos_id
    ends = is_eos | (actions == pad_id)
    first = ends.argmax(axis=-1)
    at_eos = np.take_along_axis(is_eos, first[..., None], axis=-1)[..., 0]
    return np.where(ends.any(axis=-1), first + at_eos, actions.shape[-1]).astype(np.int32)


def update_padding_fraction(
    obs: np.ndarray, action: np.ndarray, valid: np.ndarray, pad_id: int, eos_id: int
) -> float:
    """The share of the tokens an update computes for `obs` `[T, B, L]` and `action`
    `[T, B, M]` (every row at these lengths) that no valid message needs: contexts' left
    padding, answers past their EOS, and the rows of steps that are not valid."""
    computed = obs.shape[0] * obs.shape[1] * (obs.shape[2] + action.shape[2])
    real = (obs != pad_id).sum(axis=-1) + message_lengths(action, eos_id, pad_id)
    return 1.0 - float((real * valid).sum()) / computed if computed else 0.0


def decode_steps(lengths: np.ndarray, slots: int = 0) -> int:
    """The decode steps of one generation of answers of `lengths` `[E]` tokens: the longest,
    as one batch (`slots` 0, or at least E); with continuous batching over `slots` rows of KV
    cache, the last step of a slot's last answer, each answer in order taking the slot that
    frees first (the lowest of those freeing together) for its tokens, as `generate(...,
    slots)` hands them out."""
    lengths = np.maximum(np.asarray(lengths, np.int64), 1)  # every answer is one token at least
    if not slots or slots >= lengths.size:
        return int(lengths.max(initial=0))
    free = [(0, slot) for slot in range(slots)]  # (step it frees at, slot)
    for length in lengths.tolist():
        at, slot = heapq.heappop(free)
        heapq.heappush(free, (at + length, slot))
    return max(at for at, _ in free)


def generation_utilisation(
    batches: list[tuple[np.ndarray, np.ndarray]], eos_id: int, pad_id: int, slots: int = 0
) -> tuple[int, int]:
    """`(tokens needed, tokens computed)` by generation: each of `batches` is one env rank's
    `(action [T, E, M], valid [T, E])`, every step of it one generation of E answers, which
    decodes E rows until the longest answer ends, or (continuous batching) `slots` rows for
    `decode_steps`; the tokens needed are the valid answers'."""
    needed = computed = 0
    for action, valid in batches:
        lengths = message_lengths(action, eos_id, pad_id)  # [T, E]
        rows = action.shape[1] if not slots else min(slots, action.shape[1])
        computed += sum(decode_steps(step, slots) for step in lengths) * rows
        needed += int((lengths * valid).sum())
    return needed, computed


def trimmed_lengths(
    obs: np.ndarray, action: np.ndarray, pad_id: int, bucket: int
) -> tuple[int, int]:
    """The context and answer lengths an update's messages need (`obs` `[..., L]` left-padded,
    `action` `[..., M]` right-padded with `pad_id`): the columns from the first that holds a
    token in any message, and up to the last that does, each rounded up to a multiple of
    `bucket` (at least one bucket) and at most L or M."""
    response_length = action.shape[-1]
    used_response = np.flatnonzero((action != pad_id).reshape(-1, response_length).any(axis=0))
    need_response = used_response[-1] + 1 if used_response.size else 0
    return context_length_needed(obs, pad_id, bucket), _bucketed(
        need_response, response_length, bucket
    )


def context_length_needed(obs: np.ndarray, pad_id: int, bucket: int) -> int:
    """The columns of left-padded contexts `obs` `[..., L]` from the first that holds a token in
    any row, rounded up to a multiple of `bucket` (at least one bucket, at most L)."""
    context_length = obs.shape[-1]
    used = np.flatnonzero((obs != pad_id).reshape(-1, context_length).any(axis=0))
    return _bucketed(context_length - used[0] if used.size else 0, context_length, bucket)


def _bucketed(need: int, limit: int, bucket: int) -> int:
    return int(min(limit, max(1, -(-need // bucket)) * bucket))


def trim_text_rollout(rollout: dict[str, np.ndarray], lengths: tuple[int, int]) -> dict:
    """`rollout` with its contexts (`obs`, `last_obs`) cut to their last `lengths[0]` columns
    and its per-token fields (`action`, `log_prob`, `value`) to their first `lengths[1]`. The
    columns cut are padding in every message, which no output depends on (positions count
    from a row's first token), so the update is the same, on fewer tokens."""
    context_length, response_length = lengths
    trimmed = dict(rollout)
    for name in ("obs", "last_obs"):
        trimmed[name] = rollout[name][..., rollout[name].shape[-1] - context_length :]
    for name in ("action", "log_prob", "value"):
        trimmed[name] = rollout[name][..., :response_length]
    return trimmed
