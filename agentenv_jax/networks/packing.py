"""Sequence packing: the messages of an update laid end to end in fixed-length rows, so that a
forward pass computes no padding.

A message is its context's real tokens (left padding dropped) and its response up to and
including EOS. `pack_rows` (numpy, on the host) places messages in rows of `row_length` tokens,
longest first, each into the first row with room for it, and numbers them in each row:
`segments` is 1, 2, ... per message, 0 where nothing was placed. In a packed forward pass a
token attends only to the earlier tokens of its own segment (`segment_allowed`) and its
position counts from its segment's start (`segment_positions`), so each message is computed
exactly as it is alone. `columns` says where to read the outputs that predict each response
token, so scores come back in the `[N, M]` layout of the unpacked batch.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentenv_jax.envs.text.padding import message_lengths


class PackedRows(NamedTuple):
    """Messages packed into `R` rows of `P` tokens (`pack_rows`)."""

    tokens: np.ndarray  # int32 [R, P]: the messages' tokens, `pad_id` where none was placed
    segments: np.ndarray  # int32 [R, P]: 1, 2, ... per message within its row; 0 for padding
    rows: np.ndarray  # int32 [N]: the packed row of each message
    # int32 [N, M]: the column whose output predicts response token j of message i (clipped
    # into the row past the response's end, where the response mask is 0).
    columns: np.ndarray


def token_counts(context: np.ndarray, response: np.ndarray, pad_id: int, eos_id: int):
    """`(context tokens, response tokens)` `int [N]` of each message: its context's non-padding
    tokens, and its response's (`envs.text.padding.message_lengths`)."""
    context_tokens = (context != pad_id).sum(axis=1)
    lengths = message_lengths(response, eos_id, pad_id)
    return context_tokens.astype(np.int64), lengths.astype(np.int64)


def pack_rows(
    context: np.ndarray,
    response: np.ndarray,
    pad_id: int,
    eos_id: int,
    row_length: int,
    keep: np.ndarray | None = None,
) -> PackedRows:
    """Pack the messages of `context` `[N, L]` (left-padded) and `response` `[N, M]` into rows
    of `row_length` tokens, first fit by decreasing length. With `keep` `bool [N]`, only those
    messages are placed; the others' `rows` and `columns` are 0 (read, never placed: their
    scores are meaningless, for a loss that masks them). `ValueError` if a message is longer
    than a row."""
    context, response = np.asarray(context), np.asarray(response)
    n, m = response.shape
    keep = np.ones(n, bool) if keep is None else np.asarray(keep, bool)
    context_tokens, response_tokens = token_counts(context, response, pad_id, eos_id)
    lengths = np.where(keep, context_tokens + response_tokens, 0)
    if n and lengths.max() > row_length:
        raise ValueError(
            f"a message of {int(lengths.max())} tokens does not fit a packed row of {row_length}"
        )
    free: list[int] = []  # tokens left in each row
    placed = np.zeros((n, 2), np.int64)  # (row, start column)
    for i in np.argsort(-lengths, kind="stable"):
        if not keep[i]:
            continue
        row = next((r for r, left in enumerate(free) if left >= lengths[i]), len(free))
        if row == len(free):
            free.append(row_length)
        placed[i] = row, row_length - free[row]
        free[row] -= lengths[i]
    tokens = np.full((len(free), row_length), pad_id, np.int32)
    segments = np.zeros((len(free), row_length), np.int32)
    columns = np.zeros((n, m), np.int32)
    numbers = np.zeros(len(free), np.int32)
    for i in np.flatnonzero(keep):
        row, start = placed[i]
        c, r = context_tokens[i], response_tokens[i]
        tokens[row, start : start + c] = context[i, context.shape[1] - c :]
        tokens[row, start + c : start + c + r] = response[i, :r]
        numbers[row] += 1
        segments[row, start : start + c + r] = numbers[row]
        # Response token j is predicted by the output at the token before it.
        columns[i] = np.minimum(start + c - 1 + np.arange(m), row_length - 1)
    return PackedRows(tokens, segments, placed[:, 0].astype(np.int32), columns)


# The arrays a packed update adds to its rollout (`packed_minibatches`): each minibatch's
# messages and its `PackedRows`, field by field in their order; and every message of the
# update packed at once, for the passes over all of them (the reference policy's scores).
PACKED_ROW_FIELDS = ("packed_tokens", "packed_segments", "packed_rows", "packed_columns")
PACKED_MESSAGE_FIELDS = tuple(f"all_{name}" for name in PACKED_ROW_FIELDS)
PACKED_FIELDS = ("minibatch_orders", *PACKED_ROW_FIELDS, *PACKED_MESSAGE_FIELDS)
# The fields whose rows a learner's devices split (a minibatch's `[E, K, R, P]` on R, every
# message's `[R, P]` on R); the others are indices into them, kept whole on every device.
PACKED_ROW_AXES = {
    "packed_tokens": 2,
    "packed_segments": 2,
    "all_packed_tokens": 0,
    "all_packed_segments": 0,
}


def packed_minibatches(
    context: np.ndarray,
    response: np.ndarray,
    keep: np.ndarray,
    pad_id: int,
    eos_id: int,
    row_length: int,
    num_epochs: int,
    num_minibatches: int,
    rng: np.random.Generator,
    row_bucket: int | None = None,
    row_multiple: int = 1,
) -> dict[str, np.ndarray]:
    """An update's minibatches over the messages `context` `[N, L]` and `response` `[N, M]`,
    each packed (`pack_rows`, the messages `keep` marks): `minibatch_orders` `int32 [E, K, n]`
    (each epoch a permutation, cut into K minibatches of n = N // K messages), and per
    minibatch `packed_tokens` / `packed_segments` `[E, K, R, P]`, `packed_rows` `[E, K, n]`
    and `packed_columns` `[E, K, n, M]`, where R is the most rows a minibatch needs, rounded
    up to a multiple of `row_bucket` (default: an eighth of n, so that R takes at most 8
    values over a run: each new R compiles the update once). The `all_` fields
    (`PACKED_MESSAGE_FIELDS`) are the N messages packed at once, their rows rounded up to a
    multiple of an eighth of N. Every row count is also a multiple of `row_multiple` (the
    devices that split the rows: `PACKED_ROW_AXES`)."""
    total = len(context)
    size = total // num_minibatches
    orders = np.stack(
        [
            rng.permutation(total)[: size * num_minibatches].reshape(num_minibatches, size)
            for _ in range(num_epochs)
        ]
    ).astype(np.int32)
    plans = [
        [pack_rows(context[o], response[o], pad_id, eos_id, row_length, keep[o]) for o in epoch]
        for epoch in orders
    ]
    most = max(plan.tokens.shape[0] for epoch in plans for plan in epoch)
    bucket = np.lcm(max(size // 8, 1) if row_bucket is None else row_bucket, row_multiple)
    every = pack_rows(context, response, pad_id, eos_id, row_length, keep)
    per_minibatch = [
        [_rows_padded(plan, pad_id, _rounded_up(most, bucket)) for plan in epoch] for epoch in plans
    ]
    whole_bucket = np.lcm(max(total // 8, 1), row_multiple)
    whole = _rows_padded(every, pad_id, _rounded_up(every.tokens.shape[0], whole_bucket))
    return {
        "minibatch_orders": orders,
        **{
            name: np.array([[plan[k] for plan in epoch] for epoch in per_minibatch])
            for k, name in enumerate(PACKED_ROW_FIELDS)
        },
        **dict(zip(PACKED_MESSAGE_FIELDS, whole, strict=True)),
    }


def _rounded_up(rows: int, bucket: int) -> int:
    return int(-(-max(rows, 1) // bucket) * bucket)


def _rows_padded(plan: PackedRows, pad_id: int, rows: int) -> PackedRows:
    """`plan` with rows of nothing (`pad_id`, segment 0) added up to `rows` rows."""
    extra = ((0, rows - plan.tokens.shape[0]), (0, 0))
    return plan._replace(
        tokens=np.pad(plan.tokens, extra, constant_values=pad_id),
        segments=np.pad(plan.segments, extra, constant_values=0),
    )


def segment_positions(segments: jax.Array) -> jax.Array:
    """`int32 [B, T]`: each token's position within its segment (0 at the segment's first
    token), where a segment is a run of equal ids in `segments` `[B, T]`."""
    index = jnp.arange(segments.shape[1], dtype=jnp.int32)[None]
    before = jnp.concatenate([jnp.full_like(segments[:, :1], -1), segments[:, :-1]], axis=1)
    starts = jnp.where(segments != before, index, 0)
    return index - jax.lax.cummax(starts, axis=1)


def segment_allowed(segments: jax.Array) -> jax.Array:
    """`bool [B, T, T]`: token t may attend to token s <= t of the same segment (id > 0)."""
    length = segments.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    same = segments[:, :, None] == segments[:, None, :]
    return causal[None] & same & (segments > 0)[:, None, :]
