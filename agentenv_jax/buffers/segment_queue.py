"""The on-policy buffer partition of one env rank: a queue of fixed-layout rollout segments.

A segment is `T` vector steps of the rank's `E` envs, written in place into a preallocated
message buffer (see `on_policy_segment_spec`). Segments wait here until the transport holds a
credit for them, so an env rank never blocks on a send; the queue depth is a metric.
"""

from __future__ import annotations

import collections

import numpy as np

from agentenv_jax.buffers.frame_stacks import frame_fields
from agentenv_jax.envs.factory import EnvSpaces
from agentenv_jax.transport.spec import FieldSpec, MessageSpec

# An env rank's seconds per segment: stepping its envs, in policy calls (of which, under
# central inference, `inference_queue_s` waited for the learner beyond its answering), and
# waiting on the transport (parameters, credits, sends).
ACTOR_TIMERS = ("env_step_s", "inference_s", "inference_queue_s", "transport_wait_s")


def on_policy_segment_spec(
    spaces: EnvSpaces, rollout_length: int, local_num_envs: int
) -> MessageSpec:
    """The layout of one segment: time-major `[T, E]` transitions plus per-segment statistics.

    Per transition: `obs` (uint8 images as they are, else float32, normalized when configured),
    `action` (int32 for Discrete/MultiDiscrete), (scaled) `reward`, `terminated`, `truncated`,
    `valid` (0 on the auto-reset steps of NEXT_STEP vector envs), behaviour `log_prob` and `value`,
    `bootstrap_value` (V(final obs) where truncated), the `policy_version` that acted, and the
    raw `episode_return`/`episode_length` of episodes that ended there (NaN/0 elsewhere).
    Per segment: `last_value [E]` and `last_obs [E, ...]` (after the last step), the
    raw-observation and discounted-return statistics of this
    segment (to merge into the global normalizers), the actor's timers and a sequence number.

    Frame-stacked images (`spaces.stacked_frames`) carry `obs` as one frame per step
    (`buffers.frame_stacks.frame_fields`).

    Text envs (`spaces.text`): a transition is one message, `obs [T, E, L]` and
    `action [T, E, M]` int32 token ids, `log_prob`/`value` per generated token `[T, E, M]`, and
    three more fields: `response_tokens [T, E]` (tokens generated, EOS included),
    `episode_success [T, E]` (1/0 where an episode ended, NaN elsewhere) and `token_version
    [T, E, M]` (the parameter version each token was drawn under, -1 after the answer: a
    partial rollout's answers span versions); a task whose reward
    sums K named reward functions (`TextSpec.reward_names`) adds `reward_terms [T, E, K]`
    (each function's value, NaN where it gave none) and `reward_failed [T, E, K]`.
    """
    t, e = rollout_length, local_num_envs
    obs_dtype = np.dtype(spaces.obs_dtype)
    d = spaces.normalizer_dim
    per_token = () if spaces.text is None else (spaces.text.response_length,)
    text_fields = []
    if spaces.text is not None:
        text_fields = [
            FieldSpec("response_tokens", (t, e), np.int32),
            FieldSpec("episode_success", (t, e), np.float32),
            FieldSpec("token_version", (t, e, *per_token), np.int32),
        ]
        if spaces.text.reward_names:
            k = len(spaces.text.reward_names)
            text_fields += [
                FieldSpec("reward_terms", (t, e, k), np.float32),
                FieldSpec("reward_failed", (t, e, k), np.uint8),
            ]
    obs_fields = [FieldSpec("obs", (t, e, *spaces.obs_shape), obs_dtype)]
    if spaces.stacked_frames > 1:
        obs_fields = frame_fields(t, e, spaces.obs_shape, obs_dtype)
    return MessageSpec(
        [
            *obs_fields,
            FieldSpec("action", (t, e, *spaces.action_shape), spaces.action_dtype),
            FieldSpec("reward", (t, e), np.float32),
            FieldSpec("log_prob", (t, e, *per_token), np.float32),
            FieldSpec("value", (t, e, *per_token), np.float32),
            FieldSpec("bootstrap_value", (t, e), np.float32),
            FieldSpec("episode_return", (t, e), np.float32),
            FieldSpec("episode_length", (t, e), np.int32),
            FieldSpec("policy_version", (t, e), np.int64),
            FieldSpec("terminated", (t, e), np.uint8),
            FieldSpec("truncated", (t, e), np.uint8),
            FieldSpec("valid", (t, e), np.uint8),
            FieldSpec("last_value", (e,), np.float32),
            FieldSpec("last_obs", (e, *spaces.obs_shape), obs_dtype),
            FieldSpec("obs_stats", (1 + 2 * d,), np.float64),  # count, mean [D], m2 [D]
            FieldSpec("return_stats", (3,), np.float64),  # count, mean, m2
            FieldSpec("actor_seconds", (len(ACTOR_TIMERS),), np.float64),
            FieldSpec("sequence", (1,), np.int64),
            FieldSpec("env_faults", (1,), np.int64),  # cumulative on this env rank
            *text_fields,
        ]
    )


def segment_counts(fields: dict[str, np.ndarray]) -> tuple[int, int, int]:
    """What a segment holds, for the accounting: its valid transitions, the tokens they
    generated (text envs; else 0) and the episodes that ended in it (layouts without episode
    fields, such as the transport's test streams, hold none)."""
    valid = fields["valid"].astype(bool)
    tokens = int(fields["response_tokens"][valid].sum()) if "response_tokens" in fields else 0
    returns = fields.get("episode_return")
    episodes = 0 if returns is None else int(np.count_nonzero(np.isfinite(returns)))
    return int(valid.sum()), tokens, episodes


class SegmentQueue:
    """A fixed pool of segment buffers: free -> being written -> ready -> in flight -> free."""

    def __init__(self, spec: MessageSpec, capacity: int):
        self.spec = spec
        self._free = collections.deque(spec.allocate() for _ in range(capacity))
        self._ready: collections.deque[np.ndarray] = collections.deque()
        self.sent_transitions = 0  # valid transitions in segments handed to the transport
        self.sent_tokens = 0  # tokens those transitions generated (text envs)
        self.sent_episodes = 0  # episodes that ended in them
        self.unsent_tokens = 0  # of the segments `discard_ready` dropped
        self.unsent_episodes = 0

    def acquire(self) -> np.ndarray:
        """A free buffer to write a segment into."""
        if not self._free:
            raise RuntimeError("segment queue is full: no free buffer (flow control broken)")
        return self._free.popleft()

    def push(self, buffer: np.ndarray) -> None:
        """A written segment, ready to send."""
        self._ready.append(buffer)

    def pop_ready(self) -> np.ndarray:
        """The oldest ready segment, which the transport is about to send."""
        buffer = self._ready.popleft()
        transitions, tokens, episodes = segment_counts(self.spec.views(buffer))
        self.sent_transitions += transitions
        self.sent_tokens += tokens
        self.sent_episodes += episodes
        return buffer

    def discard_ready(self) -> int:
        """Drop every unsent segment (shutdown); returns the valid transitions they held (their
        tokens and episodes are added to `unsent_tokens` and `unsent_episodes`)."""
        dropped = 0
        while self._ready:
            buffer = self._ready.popleft()
            transitions, tokens, episodes = segment_counts(self.spec.views(buffer))
            dropped += transitions
            self.unsent_tokens += tokens
            self.unsent_episodes += episodes
            self._free.append(buffer)
        return dropped

    def release(self, buffer: np.ndarray) -> None:
        """A buffer whose send completed."""
        self._free.append(buffer)

    @property
    def depth(self) -> int:
        """Segments ready but not yet sent (waiting for a credit)."""
        return len(self._ready)

    @property
    def has_free(self) -> bool:
        return bool(self._free)
