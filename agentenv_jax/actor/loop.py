"""The env-rank loop: step the vector env with the local policy and fill rollout segments.

This is imperative shell around pure pieces: normalization maths (`envs.normalization`),
the jitted policy (`actor.policy`) and the segment layout (`buffers.segment_queue`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from agentenv_jax.actor.episodes import episode_statistics
from agentenv_jax.buffers.frame_stacks import write_frames
from agentenv_jax.buffers.segment_queue import ACTOR_TIMERS, SegmentQueue, segment_counts
from agentenv_jax.envs import normalization as norm
from agentenv_jax.envs.atari import EPISODE_SCORE, GAME_OVER, STACK_RESTART
from agentenv_jax.envs.factory import EnvSpaces, autoreset_mode
from agentenv_jax.envs.faults import fault_mask
from agentenv_jax.envs.multi_agent.columns import ACTED
from agentenv_jax.metrics.process_usage import ProcessClock
from agentenv_jax.transport.base import ActorChannel, CollectionStopped, TransportError
from agentenv_jax.transport.spec import MessageSpec

if TYPE_CHECKING:  # an env rank acting in numpy imports no JAX
    from agentenv_jax.actor.policy import ActorPolicy


def _valid_rows(x: np.ndarray, valid: np.ndarray, count: int) -> np.ndarray:
    """`x [T, E, ...]` at the `count` rows where `valid [T, E]`, time-major, as `[count, D]`:
    laid out as the per-step concatenation was, and a view when every row is valid."""
    if count == valid.size:
        return x.reshape(count, -1)
    return x[valid].reshape(count, -1)


class Actor:
    """One env rank's collector of on-policy segments.

    Segment k (its sequence number) is trained on by the learner's update k, so the rank starts
    it only with parameters of version >= k - `max_policy_lag`: with 0 this is synchronous PPO
    (lag 0), with L > 0 the rank runs up to L updates ahead (IMPALA). It fills `T` vector steps,
    queues the segment and offers it to the transport, which sends it when it holds a credit.
    `run_once` returns False once the learner asks this rank to stop.
    """

    def __init__(
        self,
        vector_env: gym.vector.VectorEnv,
        spaces: EnvSpaces,
        policy: ActorPolicy,
        channel: ActorChannel,
        segment_spec: MessageSpec,
        param_spec: MessageSpec,
        *,
        seed: int,
        env_offset: int,
        rollout_length: int,
        gamma: float,
        normalize_obs: bool,
        normalize_reward: bool,
        clip_obs: float,
        clip_reward: float,
        max_inflight_segments: int,
        max_policy_lag: int,
        timeout_s: float,
        bootstraps: bool = True,
    ):
        self._env = vector_env
        self._spaces = spaces
        self._policy = policy
        self._channel = channel
        self._segment_spec = segment_spec
        self._param_spec = param_spec
        # One buffer per credit, one being filled, and one per segment the rank may run ahead.
        self._queue = SegmentQueue(
            segment_spec, capacity=max_inflight_segments + 1 + max_policy_lag
        )
        self._num_envs = vector_env.num_envs
        self._rollout_length = rollout_length
        self._gamma = gamma
        self._normalize_obs = normalize_obs
        self._normalize_reward = normalize_reward
        self._clip_obs = clip_obs
        self._clip_reward = clip_reward
        self._timeout_s = timeout_s
        self._max_policy_lag = max_policy_lag
        # Whether segments carry the state values an update bootstraps from (`last_value`,
        # and `bootstrap_value` at truncations); without, they are 0 and the policy's value
        # pass (for a language model, a forward pass over every context) is skipped.
        self._bootstraps = bootstraps
        self._next_step_mode = autoreset_mode(vector_env) == AutoresetMode.NEXT_STEP
        if spaces.action_kind == "continuous":
            self._action_low = np.asarray(spaces.action_low, dtype=np.float32)
            self._action_high = np.asarray(spaces.action_high, dtype=np.float32)

        # Images stay uint8 all the way to the learner's network; other observations are float32.
        self._obs_dtype = np.dtype(spaces.obs_dtype)
        # Env j (global index) is seeded seed * 1_000_003 + j, whatever the topology.
        self._obs, _ = vector_env.reset(seed=seed * 1_000_003 + env_offset)
        self._obs = np.asarray(self._obs, dtype=self._obs_dtype)
        # Frame stacks travel as one frame per step (`buffers.frame_stacks`), with where the
        # stacks the policy acts on started anew: all of them after the reset.
        self._sends_frames = spaces.stacked_frames > 1
        self._restart = np.ones(self._num_envs, dtype=bool)
        # NEXT_STEP padding rows of the next vector step; None while there are none.
        self._pending_reset: np.ndarray | None = None
        self._episode_return = np.zeros(self._num_envs, dtype=np.float64)
        self._episode_length = np.zeros(self._num_envs, dtype=np.int64)
        # Per-segment scratch, kept between segments: raw rewards, and what the normalizer
        # statistics are taken of (discounted returns, raw observations).
        shape = (rollout_length, self._num_envs)
        self._rewards = np.zeros(shape, dtype=np.float64)
        # Envs that report a score apart from the training reward (Atari: unclipped, over whole
        # games rather than lives) have their episode statistics taken from it.
        self._scored = bool(getattr(vector_env, "reports_score", False))
        if self._scored:
            self._scores = np.zeros(shape, dtype=np.float64)
            self._game_over = np.zeros(shape, dtype=bool)
        if normalize_reward:
            self._discounted_return = np.zeros(self._num_envs, dtype=np.float64)
            self._returns = np.zeros(shape, dtype=np.float64)
        if normalize_obs:
            self._raw_obs = np.zeros((*shape, *spaces.obs_shape), dtype=self._obs_dtype)
        self._obs_stats = norm.empty_stats(spaces.normalizer_dim)
        self._return_stats = norm.empty_stats(1)
        self._version = -1
        # Partial rollouts (a text policy decoding in parts, `algorithm.partial_rollout_steps`):
        # parameters that arrive while answers are in flight are taken between parts.
        self._swapped_mid_answer = False
        if max_policy_lag > 0 and hasattr(policy, "between_parts"):
            policy.between_parts = self._between_answer_parts
        self._sequence = 0
        self._segments_filled = 0
        self._unreported_transport_s = 0.0
        self.produced = 0
        self.produced_tokens = 0  # text envs: tokens generated in valid transitions
        self.episodes_ended = 0
        self._text = spaces.text is not None
        self.env_faults = 0
        self.sent_segments = 0
        self.stopped = False
        self._clock = ProcessClock()

    @property
    def queue_depth(self) -> int:
        return self._queue.depth

    def _load_params(self, message: np.ndarray) -> None:
        fields = self._param_spec.views(message)
        self._version = int(fields["version"][0])
        if self._sequence == 0:
            # A resumed learner starts at its checkpoint's update u, which trains segment u.
            self._sequence = self._version
        self._policy.set_params(fields["params"])
        if hasattr(self._policy, "version"):  # a text policy stamps its tokens with it
            self._policy.version = self._version
        self._obs_stats = norm.stats_from_flat(
            fields["obs_stats"].copy(), self._spaces.normalizer_dim
        )
        self._return_stats = norm.stats_from_flat(fields["return_stats"].copy(), 1)

    def _between_answer_parts(self) -> int:
        """Between two parts of the answers in flight: the parameters that arrived meanwhile,
        taken (the answers continue under them); the version now held."""
        message = self._channel.poll_params()
        if message is not None:
            self._load_params(message)
            self._swapped_mid_answer = True
        return self._version

    def _observe(self, raw_obs: np.ndarray) -> np.ndarray:
        if not self._normalize_obs:
            return raw_obs
        return norm.normalize_observations(raw_obs, self._obs_stats, self._clip_obs)

    def _poll(self) -> bool:
        """Take the newest parameters if any arrived and move segments; True once told to stop."""
        message = self._channel.poll_params()
        if message is not None:
            self._load_params(message)
        self._channel.pump(self._queue)
        if self._channel.stop_requested():
            self.stopped = True
        return self.stopped

    def _can_collect(self) -> bool:
        # Segment k is trained on by update k, so starting it needs version >= k - max lag:
        # that bounds policy lag, and with max lag 0 it is synchronous PPO.
        required = max(0, self._sequence - self._max_policy_lag)
        return self._version >= required and self._queue.has_free

    def ready(self) -> bool:
        """Whether `run_once` would proceed (or stop) without waiting for the learner."""
        return self._poll() or self._can_collect()

    def run_once(self) -> bool:
        """Wait until the next segment may start, fill and queue it; False once told to stop."""
        started = time.perf_counter()
        deadline = started + self._timeout_s
        while not self._poll() and not self._can_collect():
            if time.perf_counter() > deadline:
                raise TransportError(
                    f"env rank waited {self._timeout_s:.0f} s for parameters version "
                    f">= {max(0, self._sequence - self._max_policy_lag)} or a credit "
                    "(twice run.transport_timeout_s): the learner is silent"
                )
            self._channel.idle()
        if self.stopped:
            return False
        # Time spent sending the previous segment counts toward this one: a segment's bytes
        # are final once it is queued (its send may be in flight from then on).
        transport_s = time.perf_counter() - started + self._unreported_transport_s
        buffer = self._queue.acquire()
        fields = self._segment_spec.views(buffer)
        queued_s = self._queued_s()
        try:
            env_s, inference_s = self._fill_segment(fields)
        except CollectionStopped:
            self._queue.release(buffer)
            self.stopped = True
            return False
        timers = {
            "env_step_s": env_s,
            "inference_s": inference_s,
            "inference_queue_s": self._queued_s() - queued_s,
            "transport_wait_s": transport_s,
        }
        fields["actor_seconds"][:] = [timers[name] for name in ACTOR_TIMERS]
        started = time.perf_counter()
        self._queue.push(buffer)
        self._channel.pump(self._queue)
        self._unreported_transport_s = time.perf_counter() - started
        return True

    def _queued_s(self) -> float:
        """Seconds the policy's requests have queued at the learner (central inference's
        `RemotePolicy`; a policy on this env rank never queues)."""
        return getattr(self._policy, "queued_s", 0.0)

    def _fill_segment(self, fields: dict[str, np.ndarray]) -> tuple[float, float]:
        """Step the envs `T` times into the segment `fields` (views `[T, E, ...]` of one
        buffer); returns the seconds spent in `env.step` and in policy calls.

        Each step does only what it must then: act, step, store. Its masks are written only
        when a row is padding or an env ended (`_end_episodes`); rewards, episode returns and
        lengths, the produced count and the normalizer statistics are computed once from the
        segment's `[T, E]` arrays at the end, with the same floating-point operations in the
        same order as a per-step update, so the results are bit-identical.
        """
        env_s = inference_s = 0.0
        rewards = self._rewards
        obs_rows, action_rows = fields.get("obs"), fields["action"]
        log_prob_rows, value_rows = fields["log_prob"], fields["value"]
        # The defaults of a row where all envs are valid and none ended; other rows are
        # written as they come.
        fields["terminated"][...] = 0
        fields["truncated"][...] = 0
        fields["valid"][...] = 1
        fields["bootstrap_value"][...] = 0.0
        fields["policy_version"][...] = self._version
        if self._text:
            fields["episode_success"][...] = np.nan
        reward_terms = "reward_terms" in fields
        if reward_terms:
            fields["reward_terms"][...] = np.nan
            fields["reward_failed"][...] = 0
        scaled_from = 0  # rows before it have their (scaled) reward written
        for t in range(self._rollout_length):
            if t > 0 and self._max_policy_lag > 0:
                # Asynchronous modes swap in new parameters between vector steps; every
                # transition records the version that chose its action.
                message = self._channel.poll_params()
                if message is not None:
                    # Rewards so far are scaled by the return statistics they were collected
                    # under, before the message replaces them.
                    self._write_rewards(fields, scaled_from, t)
                    scaled_from = t
                    self._load_params(message)
                    fields["policy_version"][t:] = self._version
            obs_in = self._observe(self._obs)
            if self._normalize_obs:
                self._raw_obs[t] = self._obs
            action, log_prob, value, outcome, policy_step_s, env_step_s = self._act_and_step(obs_in)
            next_obs, reward, terminated, truncated, info = outcome
            env_s += env_step_s
            inference_s += policy_step_s
            next_obs = np.asarray(next_obs, dtype=self._obs_dtype)
            rewards[t] = reward
            if self._scored:
                self._scores[t] = info[EPISODE_SCORE]
                self._game_over[t] = info[GAME_OVER]
            if self._normalize_reward:
                # The discounted return whose statistics scale rewards, of every row (padding
                # and faulted ones too); `_end_episodes` restarts it where an episode ended.
                np.multiply(self._discounted_return, self._gamma, out=self._discounted_return)
                self._discounted_return += rewards[t]
                self._returns[t] = self._discounted_return
            if self._sends_frames:
                write_frames(fields, t, obs_in, self._restart)
                self._restart = info[STACK_RESTART]
            else:
                obs_rows[t] = obs_in
            action_rows[t] = action
            log_prob_rows[t] = log_prob
            value_rows[t] = value
            terminated = np.asarray(terminated, dtype=bool)
            truncated = np.asarray(truncated, dtype=bool)
            if self._text:
                fields["response_tokens"][t] = info["response_tokens"]
                self._write_token_versions(fields, t, info["response_tokens"])
                if reward_terms:
                    fields["reward_terms"][t] = info["reward_terms"]
                    fields["reward_failed"][t] = info["reward_failed"]
                # Only the policy's episodes count (not a frozen opponent's seat).
                ended = (terminated | truncated) & info.get(ACTED, True)
                if ended.any():
                    fields["episode_success"][t] = np.where(ended, info["success"], np.nan)
            # (count_nonzero: a few times cheaper than `.any()` on [E] arrays, every step)
            if np.count_nonzero(terminated) or np.count_nonzero(truncated):
                inference_s += self._end_episodes(
                    fields, t, value, next_obs, terminated, truncated, info
                )
            elif self._pending_reset is not None:
                fields["valid"][t] = ~self._pending_reset
                self._pending_reset = None
            acted = info.get(ACTED)
            if acted is not None and not acted.all():
                # Multi-agent columns whose agent did not act (finished early, or absent from
                # the episode) are padding: no loss, advantage statistics or entropy.
                fields["valid"][t] &= acted
            self._obs = next_obs
        self._write_rewards(fields, scaled_from, self._rollout_length)

        tick = time.perf_counter()
        last_obs = self._observe(self._obs)
        fields["last_obs"][:] = last_obs
        fields["last_value"][:] = self._policy.value(last_obs) if self._bootstraps else 0.0
        inference_s += time.perf_counter() - tick

        valid = fields["valid"].astype(bool)
        count = int(np.count_nonzero(valid))
        if self._scored:
            episode_rewards, episode_ended = self._scores, self._game_over & valid
        else:
            episode_rewards = rewards
            episode_ended = (fields["terminated"] | fields["truncated"]).astype(bool)
        episodes = episode_statistics(
            episode_rewards, valid, episode_ended, self._episode_return, self._episode_length
        )
        fields["episode_return"][...] = episodes.episode_return
        fields["episode_length"][...] = episodes.episode_length
        self._episode_return, self._episode_length = episodes.next_return, episodes.next_length
        obs_stats = norm.empty_stats(self._spaces.normalizer_dim)
        if self._normalize_obs and count:
            obs_stats = norm.stats_of(_valid_rows(self._raw_obs, valid, count))
        return_stats = norm.empty_stats(1)
        if self._normalize_reward and count:
            return_stats = norm.stats_of(_valid_rows(self._returns, valid, count))
        fields["obs_stats"][:] = norm.stats_to_flat(obs_stats)
        fields["return_stats"][:] = norm.stats_to_flat(return_stats)
        fields["sequence"][0] = self._sequence
        fields["env_faults"][0] = self.env_faults
        self.produced += count
        _, tokens, episodes = segment_counts(fields)
        self.produced_tokens += tokens
        self.episodes_ended += episodes
        self._sequence += 1
        self._segments_filled += 1
        return env_s, inference_s

    def _write_token_versions(self, fields: dict, t: int, tokens: np.ndarray) -> None:
        """Row `t`'s `token_version`: each token's parameter version, as a partial rollout's
        policy recorded them, else the row's version up to the answer's end (-1 after)."""
        versions = getattr(self._policy, "token_versions", None)
        if versions is None:
            column = np.arange(fields["token_version"].shape[-1])
            versions = np.where(column < tokens[:, None], fields["policy_version"][t, :, None], -1)
        fields["token_version"][t] = versions
        if self._swapped_mid_answer:  # the answers after this one start under the new version
            fields["policy_version"][t + 1 :] = self._version
            self._swapped_mid_answer = False

    def _env_action(self, action: np.ndarray) -> np.ndarray:
        if self._spaces.action_kind == "continuous":
            return np.clip(action, self._action_low, self._action_high)
        return action

    def _act_and_step(self, obs_in: np.ndarray) -> tuple:
        """The policy's actions for every env and the vector env's step on them: `(action,
        log_prob, value, (next_obs, reward, terminated, truncated, info), policy seconds, env
        seconds)`.

        A C++ vector env in groups (`env.num_splits`, `envs.atari.AtariVectorEnv.splits`) is
        sent each group's actions as soon as the policy has chosen them, so its threads step
        group k while the policy acts for group k + 1; all groups' results are then received
        together, and the row is one step of every env as without groups. Env seconds are
        those spent sending and waiting for the results."""
        splits = getattr(self._env, "splits", ())
        if len(splits) <= 1:
            tick = time.perf_counter()
            # An env whose rows ask for their own sampling (the agent env's requests).
            row_sampling = getattr(self._env, "row_sampling", None)
            if row_sampling is None:
                action, log_prob, value = self._policy.act(obs_in)
            else:
                action, log_prob, value = self._policy.act(obs_in, sampling=row_sampling())
            tock = time.perf_counter()
            outcome = self._env.step(self._env_action(action))
            return action, log_prob, value, outcome, tock - tick, time.perf_counter() - tock
        parts, policy_s, env_s = [], 0.0, 0.0
        for split, rows in enumerate(splits):
            tick = time.perf_counter()
            part = self._policy.act(obs_in[rows])
            tock = time.perf_counter()
            self._env.send_split(split, self._env_action(part[0]))
            policy_s += tock - tick
            env_s += time.perf_counter() - tock
            parts.append(part)
        tick = time.perf_counter()
        outcome = self._env.recv_splits()
        env_s += time.perf_counter() - tick
        action, log_prob, value = (np.concatenate(columns) for columns in zip(*parts, strict=True))
        return action, log_prob, value, outcome, policy_s, env_s

    def _end_episodes(
        self,
        fields: dict[str, np.ndarray],
        t: int,
        value: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        info: dict,
    ) -> float:
        """Row `t` of a vector step in which an env reported an end: its `terminated`,
        `truncated` and `valid` masks, faults, bootstrap values, and the padding rows of the next
        step. `value [E]` is the step's behaviour value, `next_obs [E, ...]`, `terminated [E]`
        and `truncated [E]` (bool) what `env.step` returned. Returns the seconds spent in policy
        calls."""
        inference_s = 0.0
        valid = None if self._pending_reset is None else ~self._pending_reset  # None: all valid
        if valid is not None:
            terminated = terminated & valid
            truncated = truncated & valid
        truncated = truncated & ~terminated
        ended = terminated | truncated
        fields["terminated"][t] = terminated
        fields["truncated"][t] = truncated
        # A faulted step has no real outcome: not a transition, and its episode is dropped.
        # (`fault_mask` reads `final_info`, which vector envs add only on steps where one ended.)
        faulted = None
        if "final_info" in info:
            faulted = fault_mask(info, self._num_envs)
            if valid is not None:
                faulted = faulted & valid
            if faulted.any():
                self.env_faults += int(faulted.sum())
                valid = ~faulted if valid is None else valid & ~faulted
            else:
                faulted = None
        if valid is not None:
            fields["valid"][t] = valid
        if self._normalize_reward:
            self._discounted_return[ended] = 0.0
        if truncated.any() and self._bootstraps:
            tick = time.perf_counter()
            fields["bootstrap_value"][t] = np.where(
                truncated,
                self._policy.value(self._observe(self._final_obs(next_obs, truncated, info))),
                0.0,
            )
            inference_s += time.perf_counter() - tick
        if faulted is not None:
            # Zero TD error on the faulted row, so the partial episode's last real step
            # bootstraps as if it had continued.
            first_value = value if value.ndim == 1 else value[:, 0]  # text: the first token's
            fields["bootstrap_value"][t, faulted] = first_value[faulted] / max(self._gamma, 1e-8)
        if self._next_step_mode and ended.any():
            self._pending_reset = ended
        else:
            self._pending_reset = None
        return inference_s

    def _write_rewards(self, fields: dict[str, np.ndarray], start: int, stop: int) -> None:
        """Rows `[start, stop)` of the segment's `reward` (their masks written): the raw rewards,
        scaled by the current return statistics when rewards are normalized, 0 on invalid rows."""
        rewards = self._rewards[start:stop]
        if self._normalize_reward:
            rewards = norm.scale(rewards, self._return_stats, self._clip_reward)
        fields["reward"][start:stop] = np.where(fields["valid"][start:stop], rewards, 0.0)

    def _final_obs(self, next_obs: np.ndarray, truncated: np.ndarray, info: dict) -> np.ndarray:
        """The observation each truncated env ended on (SAME_STEP envs return the reset one)."""
        if self._next_step_mode:
            return next_obs
        final = next_obs.copy()
        for i in np.flatnonzero(truncated & info.get("_final_obs", truncated)):
            final[i] = info["final_obs"][i]
        return final

    def finish(self) -> dict[str, Any]:
        """Send what is in flight, report this rank's accounting, close the envs."""
        self._channel.flush(self._queue, self._timeout_s)
        unsent = self._queue.discard_ready()
        report = {
            "produced": self.produced,
            "sent": self._queue.sent_transitions,
            "unsent": unsent,
            "segments": self._segments_filled,
            # What this rank's policy holds of the parameters (0 with central inference).
            "policy_params": self._policy.num_params,
            **self._clock.report(),
        }
        if self._normalize_obs:
            # The statistics this rank normalizes with: the learner's last broadcast.
            report["obs_normalizer"] = {
                "count": float(self._obs_stats.count),
                "mean": self._obs_stats.mean.tolist(),
            }
        if self._text:
            report |= {
                "produced_tokens": self.produced_tokens,
                "sent_tokens": self._queue.sent_tokens,
                "unsent_tokens": self._queue.unsent_tokens,
                "produced_episodes": self.episodes_ended,
                "sent_episodes": self._queue.sent_episodes,
                "unsent_episodes": self._queue.unsent_episodes,
            }
        self._channel.send_final_report(report)
        self._env.close()
        return report
