"""Concurrent requests become batched generation calls: 64 callers at once are served by two
calls (the first request alone, the 63 that queued meanwhile together), batches never pass
`max_batch`, a failing call fails its own batch only, and closing fails what is queued."""

from __future__ import annotations

import threading
import time

import pytest

from agentenv_jax.envs.agent.batching import RequestBatcher


class HeldGenerator:
    """Doubles each request; its first call waits until the test lets it go, so that the
    requests sent meanwhile queue up behind it."""

    def __init__(self):
        self.release = threading.Event()
        self.sizes: list[int] = []

    def __call__(self, requests):
        if not self.sizes:
            self.release.wait(timeout=30)
        self.sizes.append(len(requests))
        return [2 * r for r in requests]


def wait_for_queue(batcher: RequestBatcher, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(batcher._pending) < count:
        assert time.monotonic() < deadline, "requests did not queue"
        time.sleep(0.001)


def test_64_concurrent_callers_are_served_by_two_generation_calls():
    generator = HeldGenerator()
    batcher = RequestBatcher(generator, max_batch=64)
    first = batcher.submit(0)
    while batcher._pending:  # the first request is taken, its call held
        time.sleep(0.001)
    results = {}

    def agent(i):
        results[i] = batcher.submit(i).result(timeout=30)

    agents = [threading.Thread(target=agent, args=(i,)) for i in range(1, 64)]
    for thread in agents:
        thread.start()
    wait_for_queue(batcher, 63)
    generator.release.set()
    for thread in agents:
        thread.join()
    assert first.result(timeout=30) == 0
    assert results == {i: 2 * i for i in range(1, 64)}
    assert generator.sizes == [1, 63]
    assert (batcher.counts.calls, batcher.counts.requests, batcher.counts.largest) == (2, 64, 63)
    batcher.close()


def test_batches_never_pass_max_batch():
    generator = HeldGenerator()
    batcher = RequestBatcher(generator, max_batch=4)
    futures = [batcher.submit(0)]
    while batcher._pending:  # the first request is taken, its call held
        time.sleep(0.001)
    futures += [batcher.submit(i) for i in range(1, 10)]
    generator.release.set()
    assert [f.result(timeout=30) for f in futures] == [2 * i for i in range(10)]
    assert generator.sizes == [1, 4, 4, 1]
    batcher.close()


def test_a_failing_call_fails_its_batch_and_the_batcher_goes_on():
    calls = []

    def generate(requests):
        calls.append(list(requests))
        if "bad" in requests:
            raise ValueError("the model failed")
        return [r.upper() for r in requests]

    batcher = RequestBatcher(generate, max_batch=8)
    with pytest.raises(ValueError, match="the model failed"):
        batcher.submit("bad").result(timeout=30)
    assert batcher.submit("ok").result(timeout=30) == "OK"
    assert batcher.counts.calls == 1  # failed calls are not counted as served
    batcher.close()


def test_closing_fails_what_is_queued():
    generator = HeldGenerator()
    batcher = RequestBatcher(generator, max_batch=1)
    batcher.submit(0)
    while batcher._pending:
        time.sleep(0.001)
    queued = batcher.submit(1)
    closing = threading.Thread(target=batcher.close)
    closing.start()
    with pytest.raises(RuntimeError, match="closed"):
        queued.result(timeout=30)
    generator.release.set()
    closing.join(timeout=30)
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit(2)
