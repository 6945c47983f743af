"""Central inference on the learner's devices (SEED RL style; `topology.inference: learner`).

Env ranks send observations; the learner batches the requests of all its env ranks into one
jitted call of the policy on its own devices (KV-cached generation for language models) and
answers each. The policy is the one env ranks would run (`actor.policy`, `actor.text_policy`),
fed the learner's current parameters without a host copy, and each env rank keeps its own
noise stream here, so what an env is answered does not depend on which requests share a batch.

The server answers on a thread of its own (`topology.inference_serving: thread`, SEED RL's
design), so env ranks that run ahead of the learner (`max_policy_lag > 0`) are served while it
updates; or only while the learner waits for a round's segments (`between_rounds`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from agentenv_jax.envs.spaces import TextSpec
from agentenv_jax.envs.text.padding import message_lengths
from agentenv_jax.transport.messages import INFERENCE_ACT
from agentenv_jax.transport.spec import MessageSpec

# How long a request waits for the other env ranks' before it is answered in a smaller batch:
# in a synchronous round they step together, so their requests arrive within a few hundred
# microseconds of each other.
BATCH_WAIT_S = 0.002
# How long the serving thread sleeps when no request is waiting: short against a generation
# call, long enough to leave the interpreter to the learner's own thread.
IDLE_S = 0.0002
# The interpreter's thread switch interval while the serving thread runs: a thread that wants
# the interpreter waits up to this long for one that polls (5 ms by default, as long as a
# whole generation call of a small policy).
SWITCH_INTERVAL_S = 0.0002


class BatchPolicy(Protocol):
    """What the server calls: the policy with the noise of each row given."""

    def set_params(self, flat_params: Any) -> None: ...

    def act_with(
        self, obs: np.ndarray, noise: np.ndarray, sampling: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def value(self, obs: np.ndarray) -> np.ndarray: ...


class Endpoint(Protocol):
    """The learner's end of the requests (`transport.mpi.inference.MPIInferenceEndpoint`)."""

    def poll(self) -> list[int]: ...

    def request(self, index: int) -> np.ndarray: ...

    def reply_buffer(self, index: int) -> np.ndarray: ...

    def reply(self, index: int) -> None: ...

    def close(self) -> None: ...


class InferenceServer:
    """Answers the inference requests of a learner's env ranks (`local_num_envs[i]` envs each)
    with one `policy` call per batch, every call padded to all of them (one shape, one compile).

    `noise[i]()` draws env rank i's noise for one call (`noise_source` of the policy, seeded as
    that env rank's own policy would be). `text`: a text env's spec, to count generated tokens.
    `threaded`: `start` starts the serving thread (else the learner calls `serve` itself).
    """

    def __init__(
        self,
        policy: BatchPolicy,
        endpoint: Endpoint | None,
        request_specs: Sequence[MessageSpec],
        reply_specs: Sequence[MessageSpec],
        noise: Sequence[Callable[[], np.ndarray]],
        text: TextSpec | None = None,
        threaded: bool = False,
    ):
        self._policy = policy
        self._endpoint = endpoint
        self._request_specs = list(request_specs)
        self._reply_specs = list(reply_specs)
        self._noise = list(noise)
        self._bounds = np.cumsum([0, *(spec["obs"].shape[0] for spec in request_specs)])
        self._text = text
        self._pending: dict[int, float] = {}  # env-rank index -> when its request was taken
        self.requests = 0
        self.batches = 0  # policy calls: act batches ...
        self.value_batches = 0  # ... and value-only ones (bootstrapping)
        self.rows = 0  # rows of real requests answered (padding excluded)
        self.tokens_generated = 0
        self.compute_s = 0.0
        # Requests answered while the learner's update ran (`during_update`): only the serving
        # thread answers then.
        self.requests_while_updating = 0
        self._updating = False
        # The serving thread, once started; it serves until `close`, and an error it meets is
        # raised on the learner's thread by `check`.
        self._threaded = threaded
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._error: BaseException | None = None
        # On the thread no round says which env ranks are stepping: those of the last batch
        # (they step together) are waited for.
        self._last_batch: list[int] = []

    def set_params(self, flat_params: Any) -> None:
        self._policy.set_params(flat_params)

    @contextlib.contextmanager
    def during_update(self) -> Iterator[None]:
        """Around the learner's update: the requests answered meanwhile are counted in
        `requests_while_updating` (a batch counts where it ends)."""
        self._updating = True
        try:
            yield
        finally:
            self._updating = False

    @property
    def threaded(self) -> bool:
        """Whether requests are answered on the serving thread (else by `serve`)."""
        return self._threaded

    def start(self) -> None:
        """With `threaded`: answer requests from a thread of its own from now on, until
        `close`."""
        if not self._threaded or self._thread is not None:
            return
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread = threading.Thread(target=self._serve_until_closed, name="inference")
        self._thread.daemon = True  # a failing learner exits without waiting for it
        self._thread.start()

    def _serve_until_closed(self) -> None:
        try:
            while not self._closing.is_set():
                if not self.serve(lambda: self._last_batch):
                    time.sleep(IDLE_S)
        except BaseException as err:  # raised again on the learner's thread by `check`
            self._error = err

    def check(self, collecting: object = None) -> None:
        """Raise on the calling thread the error the serving thread stopped with, if any.

        It replaces `serve` (and takes its argument) while the learner waits for a round, and
        pauses as it checks: a learner that spun while waiting would take from generation the
        core it needs."""
        if self._error is not None:
            raise self._error
        time.sleep(IDLE_S)

    def close(self) -> None:
        """At shutdown, once every env rank has reported: the serving thread stops and the
        endpoint lets its receives go."""
        if self._thread is not None:
            self._closing.set()
            self._thread.join()
            self.check()
        self._endpoint.close()

    def serve(self, collecting: Callable[[], Sequence[int]] | None = None) -> bool:
        """Take the requests that arrived; answer them once every env rank still `collecting`
        has asked (or the oldest waited `BATCH_WAIT_S`). True if it answered any."""
        now = time.perf_counter()
        for index in self._endpoint.poll():
            self._pending[index] = now
        if not self._pending:
            return False
        missing = [i for i in (collecting() if collecting else ()) if i not in self._pending]
        if missing and now - min(self._pending.values()) < BATCH_WAIT_S:
            return False
        indices = sorted(self._pending)
        self._pending.clear()
        requests = [self._request_specs[i].views(self._endpoint.request(i)) for i in indices]
        replies = [self._reply_specs[i].views(self._endpoint.reply_buffer(i)) for i in indices]
        self.answer(indices, requests, replies)
        for index in indices:
            self._endpoint.reply(index)
        self._last_batch = indices
        return True

    def answer(
        self,
        indices: list[int],
        requests: list[dict[str, np.ndarray]],
        replies: list[dict[str, np.ndarray]],
    ) -> None:
        """Fill `replies` (views) for the `requests` of env ranks `indices`: one batched call
        for the act requests and one for the value requests among them."""
        tick = time.perf_counter()
        for act in (True, False):
            chosen = [
                k for k, r in enumerate(requests) if (int(r["kind"][0]) == INFERENCE_ACT) == act
            ]
            if not chosen:
                continue
            asking = [indices[k] for k in chosen]
            obs = self._full_batch(asking, [requests[k]["obs"] for k in chosen])
            if act:
                noise = self._full_noise(asking)
                if "sampling" in requests[chosen[0]]:  # a text env's per-row sampling
                    sampling = self._full_batch(asking, [requests[k]["sampling"] for k in chosen])
                    action, log_prob, value = self._policy.act_with(obs, noise, sampling=sampling)
                else:
                    action, log_prob, value = self._policy.act_with(obs, noise)
            else:
                state_value = self._policy.value(obs)
            for k in chosen:
                a, b = self._bounds[indices[k]], self._bounds[indices[k] + 1]
                if act:
                    replies[k]["action"][...] = action[a:b]
                    replies[k]["log_prob"][...] = log_prob[a:b]
                    replies[k]["value"][...] = value[a:b]
                    self.rows += b - a
                    if self._text is not None:
                        self.tokens_generated += int(
                            message_lengths(action[a:b], self._text.eos_id, self._text.pad_id).sum()
                        )
                else:
                    replies[k]["state_value"][...] = state_value[a:b]
            if act:
                self.batches += 1
            else:
                self.value_batches += 1
        served_s = time.perf_counter() - tick
        for reply in replies:
            reply["served_s"][0] = served_s
        self.requests += len(indices)
        if self._updating:
            self.requests_while_updating += len(indices)
        self.compute_s += served_s

    def _full_batch(self, indices: list[int], fields: list[np.ndarray]) -> np.ndarray:
        """Every env rank's rows of a request field (observations, sampling): the requests'
        where they asked, copies of the first request's first row elsewhere (answered, never
        read)."""
        first = fields[0]
        rows = np.empty((self._bounds[-1], *first.shape[1:]), first.dtype)
        rows[...] = first[:1]
        for index, field in zip(indices, fields, strict=True):
            rows[self._bounds[index] : self._bounds[index + 1]] = field
        return rows

    def _full_noise(self, indices: list[int]) -> np.ndarray:
        draws = {index: self._noise[index]() for index in indices}
        sample = next(iter(draws.values()))
        noise = np.zeros((self._bounds[-1], *sample.shape[1:]), sample.dtype)
        for index, draw in draws.items():
            noise[self._bounds[index] : self._bounds[index + 1]] = draw
        return noise

    def report(self) -> dict[str, Any]:
        """For `summary.json`: how the server was used."""
        return {
            "requests": self.requests,
            "requests_while_updating": self.requests_while_updating,
            "act_batches": self.batches,
            "value_batches": self.value_batches,
            "rows_per_act_batch": self.rows / max(self.batches, 1),
            "tokens_generated": self.tokens_generated,
            "compute_s": self.compute_s,
        }
