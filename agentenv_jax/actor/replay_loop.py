"""The env-rank loop in replay mode: step the envs into the rank's replay partition, and serve
the learner's sample requests and priority updates between vector steps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from agentenv_jax.actor.policy import SquashedGaussianPolicy
from agentenv_jax.buffers.replay import ReplayPartition
from agentenv_jax.envs.factory import EnvSpaces, autoreset_mode
from agentenv_jax.envs.faults import fault_mask
from agentenv_jax.metrics.process_usage import ProcessClock
from agentenv_jax.networks.sac_networks import unit_to_bounds
from agentenv_jax.transport.base import TransportError
from agentenv_jax.transport.messages import MAX_EPISODES_PER_ANSWER, REPLAY_COUNTERS
from agentenv_jax.transport.spec import MessageSpec


class ReplayActor:
    """One env rank in replay mode.

    It inserts at most `insert_allowance` transitions (the learner's rate limiter raises it as it
    samples), answers every sample request as soon as it sees one, and applies new priorities;
    none of these waits for the others or for an episode to end.
    """

    def __init__(
        self,
        vector_env: gym.vector.VectorEnv,
        spaces: EnvSpaces,
        policy: SquashedGaussianPolicy,
        channel: Any,
        partition: ReplayPartition,
        param_spec: MessageSpec,
        request_spec: MessageSpec,
        answer_spec: MessageSpec,
        priority_spec: MessageSpec,
        *,
        seed: int,
        env_offset: int,
        random_steps: int,
        timeout_s: float,
        save_partition: Callable[[int, dict[str, np.ndarray]], Any] | None = None,
    ):
        self._env = vector_env
        self._policy = policy
        self._channel = channel
        self._partition = partition
        self._param_spec = param_spec
        self._request_spec = request_spec
        self._answer_spec = answer_spec
        self._priority_spec = priority_spec
        self._answer = answer_spec.allocate()
        self._num_envs = vector_env.num_envs
        self._random_steps = random_steps  # this rank's share of algorithm.learning_starts
        self._timeout_s = timeout_s
        self._save_partition = save_partition  # (checkpoint update, snapshot) -> file
        self._next_step_mode = autoreset_mode(vector_env) == AutoresetMode.NEXT_STEP
        self._low = np.asarray(spaces.action_low, np.float32)
        self._high = np.asarray(spaces.action_high, np.float32)
        self._rng = np.random.default_rng([seed, env_offset, 17])
        self._obs = np.asarray(vector_env.reset(seed=seed * 1_000_003 + env_offset)[0], np.float32)
        # NEXT_STEP padding rows of the next vector step; None while there are none.
        self._pending_reset: np.ndarray | None = None
        self._all_valid = np.ones(self._num_envs, bool)
        self._all_valid.flags.writeable = False
        self._episode_return = np.zeros(self._num_envs)
        self._episode_length = np.zeros(self._num_envs, np.int64)
        self._finished: list[tuple[float, int]] = []
        self._episodes_finished = 0
        self._allowance = 0
        self._request: np.ndarray | None = None
        self._seconds = np.zeros(3)  # env stepping, inference, serving
        self._last_heard = time.perf_counter()  # the learner's last request or priorities
        self.produced = 0
        self.env_faults = 0
        self.stopped = False
        self._clock = ProcessClock()

    def _poll(self) -> None:
        message = self._channel.poll_params()
        if message is not None:
            self._policy.set_params(self._param_spec.views(message)["params"])
        if self._request is None:
            self._request = self._channel.poll_request()
        if self._channel.stop_requested():
            self.stopped = True

    def _can_step(self) -> bool:
        # The allowance counts inserted transitions, as the learner's rate check does: steps
        # held for n-step returns or dropped after a fault must not use it up.
        return self._partition.counters.inserted < self._allowance and (
            self._policy.has_params or self.produced < self._random_steps
        )

    def ready(self) -> bool:
        """Whether `run_once` has something to do now (for the in-process interleaving)."""
        self._poll()
        return self.stopped or self._request is not None or self._can_step()

    def run_once(self) -> bool:
        """Serve what arrived, then take one vector step if allowed; False once told to stop."""
        self._poll()
        if self.stopped:
            return False
        tick = time.perf_counter()
        served = False
        if self._request is not None:
            self._serve(self._request)
            self._request = None
            served = True
        while (message := self._channel.poll_priorities()) is not None:
            fields = self._priority_spec.views(message)
            count = int(fields["count"][0])
            self._partition.update_priorities(
                fields["slot"][:count], fields["generation"][:count], fields["td_error"][:count]
            )
            served = True
        self._seconds[2] += time.perf_counter() - tick
        now = time.perf_counter()
        if served:
            self._last_heard = now
        if self._can_step():
            self._step()
        elif not served:
            if now - self._last_heard > self._timeout_s:
                raise TransportError(
                    f"env rank heard nothing from the learner for {self._timeout_s:.0f} s while "
                    "it could not step (twice run.transport_timeout_s): the learner is silent"
                )
            self._channel.idle()
        return True

    def _save(self, update: int | None) -> None:
        """Save the partition for the learner's checkpoint `update` (`checkpoint.save_replay`)."""
        if update is not None and self._save_partition is not None:
            self._save_partition(update, self._partition.snapshot())

    def _serve(self, request: np.ndarray) -> None:
        fields = self._request_spec.views(request)
        if fields["save_replay"][0]:
            self._save(int(fields["save_replay_update"][0]))
        self._allowance = max(self._allowance, int(fields["insert_allowance"][0]))
        count = int(fields["count"][0])
        answer = self._answer_spec.views(self._answer)
        answer["request_id"][0] = fields["request_id"][0]
        answer["count"][0] = count
        if count:
            rows = self._partition.sample(count, self._rng)
            for name, value in rows.items():
                answer[name][:count] = value
        answer["mass"][0] = self._partition.mass
        counters = self._partition.counters
        values = {
            "size": self._partition.size,
            "inserted": counters.inserted,
            "overwritten": counters.overwritten,
            "sampled": counters.sampled,
            "produced": self.produced,
            "pending": self._partition.pending,
            "episodes_finished": self._episodes_finished,
            "priority_updates": counters.priority_updates,
            "stale_priority_updates": counters.stale_priority_updates,
            "env_faults": self.env_faults,
            "restored": counters.restored,
        }
        answer["counters"][:] = [values[name] for name in REPLAY_COUNTERS]
        answer["actor_seconds"][:] = self._seconds
        reported = self._finished[:MAX_EPISODES_PER_ANSWER]
        answer["num_episodes"][0] = len(self._finished)
        answer["episode_return"][: len(reported)] = [r for r, _ in reported]
        answer["episode_length"][: len(reported)] = [n for _, n in reported]
        self._finished = []
        self._channel.send_answer(self._answer)

    def _step(self) -> None:
        """One vector step into the partition, and the episode returns and lengths it ends.

        A step with neither padding rows nor an ended episode (most of them) skips the masks:
        every row is valid, and the plain sums give the same bits as the masked ones.
        """
        tick = time.perf_counter()
        if self._policy.has_params and self.produced >= self._random_steps:
            action = self._policy.act(self._obs)
        else:
            action = self._policy.random_act(self._num_envs)
        tock = time.perf_counter()
        env_action = unit_to_bounds(action, self._low, self._high)
        next_obs, reward, terminated, truncated, info = self._env.step(env_action)
        self._seconds[0] += time.perf_counter() - tock
        self._seconds[1] += tock - tick
        next_obs = np.asarray(next_obs, np.float32)
        reward = np.asarray(reward)
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool)
        # (count_nonzero: a few times cheaper than `.any()` on [E] arrays, every step)
        if self._pending_reset is None and not (
            np.count_nonzero(terminated) or np.count_nonzero(truncated)
        ):
            self._partition.add_step(
                self._obs,
                action,
                reward.astype(np.float32),
                next_obs,
                terminated,
                truncated,
                self._all_valid,
            )
            self.produced += self._num_envs
            self._episode_return += reward
            self._episode_length += 1
        else:
            self._masked_step(action, next_obs, reward, terminated, truncated, info)
        self._obs = next_obs

    def _masked_step(
        self,
        action: np.ndarray,
        next_obs: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        info: dict,
    ) -> None:
        """`_step` for a vector step with padding rows or an ended episode (all arrays `[E, ...]`
        as `env.step` returned them): masks, faults, final observations, finished episodes."""
        valid = self._all_valid if self._pending_reset is None else ~self._pending_reset
        terminated = terminated & valid
        truncated = truncated & valid & ~terminated
        ended = terminated | truncated
        faulted = fault_mask(info, self._num_envs) & valid
        for env in np.flatnonzero(faulted):  # no real outcome: drop the partial episode
            self._partition.drop_pending(env)
        self.env_faults += int(faulted.sum())
        valid = valid & ~faulted
        final_obs = next_obs
        if not self._next_step_mode and ended.any():
            final_obs = next_obs.copy()
            for i in np.flatnonzero(ended):
                final_obs[i] = np.asarray(info["final_obs"][i], np.float32)
        self._partition.add_step(
            self._obs,
            action,
            reward.astype(np.float32),
            final_obs,
            terminated,
            truncated,
            valid,
        )
        self.produced += int(valid.sum())
        self._episode_return += np.where(valid, reward, 0.0)
        self._episode_length += valid
        for i in np.flatnonzero(ended & ~faulted):
            self._finished.append((float(self._episode_return[i]), int(self._episode_length[i])))
            self._episodes_finished += 1
        self._episode_return[ended] = 0.0
        self._episode_length[ended] = 0
        self._pending_reset = ended if self._next_step_mode and ended.any() else None

    def finish(self) -> dict[str, Any]:
        """Save the partition if the stop request asks, report its accounting, close the envs."""
        self._save(self._channel.stop_details().get("save_replay_at"))
        counters = self._partition.counters
        report = {
            "produced": self.produced,
            "inserted": counters.inserted,
            "restored": counters.restored,
            "overwritten": counters.overwritten,
            "stored": self._partition.size,
            "pending": self._partition.pending,
            "dropped": counters.dropped,
            "sampled": counters.sampled,
            "priority_updates": counters.priority_updates,
            "stale_priority_updates": counters.stale_priority_updates,
            **self._clock.report(),
        }
        self._channel.send_final_report(report)
        self._env.close()
        return report
