"""The learner's inference server on its own thread (`topology.inference_serving: thread`): it
answers an env rank's requests while the caller's thread does other work, says how long it
answered (the env rank's queueing is the rest), and an error it meets is raised on the
learner's thread. The endpoint is an in-memory one, its env rank a thread of this process."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from agentenv_jax.actor.remote_policy import RemotePolicy
from agentenv_jax.learner.inference_server import InferenceServer
from agentenv_jax.transport.messages import inference_reply_spec, inference_request_spec

NUM_ENVS = 3
POLICY_S = 0.01  # each policy call's compute


class DoublingPolicy:
    """Acts `2 * obs[:, 0]` after POLICY_S of work; raises once `fail` is set."""

    def __init__(self):
        self.fail = False
        self.threads: set[str] = set()

    def set_params(self, flat_params) -> None:
        pass

    def act_with(self, obs, noise):
        self.threads.add(threading.current_thread().name)
        if self.fail:
            raise RuntimeError("the policy failed")
        time.sleep(POLICY_S)
        rows = obs.shape[0]
        return 2 * obs[:, 0].astype(np.int64), np.zeros(rows, np.float32), np.ones(rows, np.float32)

    def value(self, obs):
        return np.zeros(obs.shape[0], np.float32)


class MemoryEndpoint:
    """One env rank's requests and replies in memory; `call` is the env rank's end."""

    def __init__(self, request_spec, reply_spec):
        self._request = request_spec.allocate()
        self._reply = reply_spec.allocate()
        self._arrived = threading.Event()
        self._answered = threading.Event()

    def call(self, request: np.ndarray) -> np.ndarray:
        self._request[...] = request
        self._answered.clear()
        self._arrived.set()
        if not self._answered.wait(timeout=30):
            raise TimeoutError("the server never answered")
        return self._reply

    def poll(self) -> list[int]:
        if self._arrived.is_set():
            self._arrived.clear()
            return [0]
        return []

    def request(self, index: int) -> np.ndarray:
        return self._request

    def reply_buffer(self, index: int) -> np.ndarray:
        return self._reply

    def reply(self, index: int) -> None:
        self._answered.set()

    def close(self) -> None:
        pass


def _server_and_env_rank():
    request_spec = inference_request_spec((2,), "float32", NUM_ENVS)
    reply_spec = inference_reply_spec((), np.dtype(np.int64), (), NUM_ENVS)
    endpoint = MemoryEndpoint(request_spec, reply_spec)
    policy = DoublingPolicy()
    server = InferenceServer(
        policy,
        endpoint,
        [request_spec],
        [reply_spec],
        [lambda: np.zeros((NUM_ENVS, 1), np.float32)],
        threaded=True,
    )
    return server, policy, endpoint, RemotePolicy(endpoint.call, request_spec, reply_spec)


def test_the_serving_thread_answers_while_the_learner_is_busy_and_times_its_answers():
    server, policy, _, env_rank = _server_and_env_rank()
    server.start()
    obs = np.arange(2 * NUM_ENVS, dtype=np.float32).reshape(NUM_ENVS, 2)
    answers = []
    started = time.perf_counter()
    # The env rank asks five times while this (the learner's) thread only sleeps, as it
    # does while an update runs: nobody calls `serve`.
    asking = threading.Thread(target=lambda: answers.extend(env_rank.act(obs)[0] for _ in range(5)))
    with server.during_update():
        asking.start()
        asking.join(timeout=30)
    answers.append(env_rank.act(obs)[0])  # and once after the update
    latency = time.perf_counter() - started
    server.check()
    server.close()
    assert policy.threads == {"inference"}
    np.testing.assert_array_equal(answers, [2 * obs[:, 0]] * 6)
    assert server.requests == server.batches == 6
    assert server.requests_while_updating == 5
    assert server.report()["requests_while_updating"] == 5
    # Each answer took at least POLICY_S (a sleep is never shorter); the env rank's waiting
    # beyond its answers is its queueing. Bounds that no load on the machine can break.
    assert server.compute_s >= 6 * POLICY_S
    assert 0.0 <= env_rank.queued_s <= latency - server.compute_s


def test_an_error_on_the_serving_thread_is_raised_on_the_learners():
    server, policy, endpoint, env_rank = _server_and_env_rank()
    policy.fail = True
    server.start()
    asking = threading.Thread(target=env_rank.act, args=(np.zeros((NUM_ENVS, 2)),))
    asking.start()
    deadline = time.monotonic() + 10
    with pytest.raises(RuntimeError, match="the policy failed"):
        while time.monotonic() < deadline:
            server.check()
    with pytest.raises(RuntimeError, match="the policy failed"):
        server.close()
    endpoint.reply(0)  # the env rank, never answered, is let go
    asking.join(timeout=10)


class SamplingEchoPolicy(DoublingPolicy):
    """Answers each row's requested temperature as its log-prob and its most tokens as its
    value."""

    def act_with(self, obs, noise, sampling=None):
        action, _, _ = super().act_with(obs, noise)
        return action, sampling[:, 0].copy(), sampling[:, 2].copy()


def test_a_text_env_rows_sampling_reaches_the_policy():
    """A text env's request carries each row's temperature, top_p and most tokens (the agent
    env's requests'); a request without them asks for 1, 1 and no limit of its own (inf): the
    policy's own distribution, whole messages."""
    request_spec = inference_request_spec((2,), "float32", NUM_ENVS, text=True)
    reply_spec = inference_reply_spec((), np.dtype(np.int64), (), NUM_ENVS)
    endpoint = MemoryEndpoint(request_spec, reply_spec)
    server = InferenceServer(
        SamplingEchoPolicy(),
        endpoint,
        [request_spec],
        [reply_spec],
        [lambda: np.zeros((NUM_ENVS, 1), np.float32)],
        threaded=True,
    )
    env_rank = RemotePolicy(endpoint.call, request_spec, reply_spec)
    server.start()
    try:
        obs = np.zeros((NUM_ENVS, 2), np.float32)
        sampling = np.array([[0.5, 1.0, 4], [1.0, 0.9, 1], [0.0, 1.0, np.inf]], np.float32)
        _, temperature, most_tokens = env_rank.act(obs, sampling=sampling)
        np.testing.assert_array_equal(temperature, [0.5, 1.0, 0.0])
        np.testing.assert_array_equal(most_tokens, [4, 1, np.inf])
        _, temperature, most_tokens = env_rank.act(obs)
        np.testing.assert_array_equal(temperature, [1.0, 1.0, 1.0])
        np.testing.assert_array_equal(most_tokens, np.inf)
        server.check()
    finally:
        server.close()
