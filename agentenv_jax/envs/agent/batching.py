"""Concurrent model calls gathered into batched generation calls.

Many agent programs on one env rank each wait on their own HTTP request; generating for each
alone would run the model at batch size 1. `RequestBatcher` queues the requests and one thread
serves them: it takes what is waiting (up to `max_batch`), waits up to `gather_s` for more
while the batch is not full, and makes one call of `generate_batch` for them all. A caller
blocks on its own future only. The batches it made and their sizes are counted, so that the
batching can be checked and reported.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

# generate_batch(requests) -> one result per request, in order.
GenerateBatch = Callable[[Sequence[Any]], Sequence[Any]]


@dataclasses.dataclass
class BatchCounts:
    """Generation calls made and the requests they served."""

    calls: int = 0
    requests: int = 0
    largest: int = 0


class RequestBatcher:
    """Serves `submit`ted requests in batched calls of `generate_batch` (see the module).
    `close()` fails what is still queued and stops the thread."""

    def __init__(self, generate_batch: GenerateBatch, max_batch: int, gather_s: float = 0.005):
        if max_batch < 1:
            raise ValueError(f"max_batch = {max_batch}: expected >= 1")
        self._generate = generate_batch
        self._max_batch = max_batch
        self._gather_s = gather_s
        self._pending: list[tuple[Any, concurrent.futures.Future]] = []
        self._ready = threading.Condition()
        self._closed = False
        self.counts = BatchCounts()
        self._thread = threading.Thread(target=self._serve, name="request-batcher", daemon=True)
        self._thread.start()

    def submit(self, request: Any) -> concurrent.futures.Future:
        """Queue `request`; its future holds `generate_batch`'s result for it (or its error)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the request batcher is closed")
            self._pending.append((request, future))
            self._ready.notify()
        return future

    def _take(self) -> list[tuple[Any, concurrent.futures.Future]]:
        with self._ready:
            while not self._pending and not self._closed:
                self._ready.wait()
            if self._closed:
                return []
            # NOTE: a short wait for more once the first request is in, so that agents whose
            # requests arrive a moment apart share a batch; a full batch goes at once.
            deadline = time.monotonic() + self._gather_s
            while len(self._pending) < self._max_batch and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._ready.wait(remaining)
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            return batch

    def _serve(self) -> None:
        while True:
            batch = self._take()
            if not batch:
                return
            requests = [request for request, _ in batch]
            try:
                results = list(self._generate(requests))
                if len(results) != len(requests):
                    raise RuntimeError(
                        f"generate_batch returned {len(results)} results for "
                        f"{len(requests)} requests"
                    )
            except BaseException as err:  # every caller of the batch sees the failure
                for _, future in batch:
                    future.set_exception(err)
                continue
            self.counts.calls += 1
            self.counts.requests += len(batch)
            self.counts.largest = max(self.counts.largest, len(batch))
            for (_, future), result in zip(batch, results, strict=True):
                future.set_result(result)

    def close(self) -> None:
        with self._ready:
            self._closed = True
            pending, self._pending = self._pending, []
            self._ready.notify_all()
        for _, future in pending:
            future.set_exception(RuntimeError("the request batcher closed"))
        self._thread.join()
