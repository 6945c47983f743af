"""What LLM-RL users read on text envs: answer accuracy, tokens generated and trained per
second, and the accounting of tokens and episodes beside the transitions' (messages')."""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentenv_jax.metrics.accounting import Accounting


class TextCounters:
    """A learner's counts on a text env. Tokens are those generated in valid transitions
    (EOS included); episodes are those that ended. Each is counted where it happens, as the
    transitions are (`metrics.accounting`): env ranks count what they generate, send and still
    hold; the learner what arrives (`receive`), what the update trained on, and what came late.
    """

    def __init__(self, window: int, reward_names: Sequence[str] = ()):
        self.reward_names = tuple(reward_names)
        # Per reward function, since the last record: the sum and count of its values, and
        # its failures.
        k = len(self.reward_names)
        self._term_sums, self._term_counts = np.zeros(k), np.zeros(k, np.int64)
        self._term_failures = np.zeros(k, np.int64)
        self._successes: collections.deque[float] = collections.deque(maxlen=window)
        self.received_tokens = 0  # this session's, counted as segments arrive
        self.received_episodes = 0
        self.trained_tokens = 0  # counted by the update, on the device
        self.late_tokens = 0  # in segments that arrived after the last update
        self.late_episodes = 0
        self.discarded_tokens = 0  # in rows a refilled update left out (dynamic sampling)
        self.discarded_episodes = 0
        # What earlier sessions of this run (before a resume) accounted for.
        self._before_tokens = Accounting()
        self._before_episodes = Accounting()
        self.tokens: Accounting | None = None  # the whole run's, at the end
        self.episodes: Accounting | None = None
        # Since the last record: the valid tokens' lags (updates behind the one that trains
        # them) summed, their count and largest, and the answers whose tokens span versions.
        self._token_lag = np.zeros(3, np.int64)
        self._answers_across_versions = 0

    def receive(self, summary: dict[str, np.ndarray]) -> None:
        """Count one segment's summary (`response_tokens`, `episode_success`, `valid`,
        `episode_return` `[T, E]`)."""
        valid = summary["valid"].astype(bool)
        self.received_tokens += int(summary["response_tokens"][valid].sum())
        self.received_episodes += int(np.count_nonzero(np.isfinite(summary["episode_return"])))
        success = summary["episode_success"]
        self._successes.extend(success[np.isfinite(success)].tolist())
        if self.reward_names:
            terms = summary["reward_terms"][valid]  # [n, K]
            given = np.isfinite(terms)
            self._term_sums += np.where(given, terms, 0.0).sum(axis=0)
            self._term_counts += given.sum(axis=0)
            self._term_failures += summary["reward_failed"][valid].sum(axis=0).astype(np.int64)

    def token_versions(self, update: int, versions: np.ndarray, valid: np.ndarray) -> None:
        """Count a round's tokens by the version each was drawn under (`token_version`
        `[T, B, M]`, -1 after an answer; `valid` `[T, B]`), for update `update`."""
        real = (versions >= 0) & valid[..., None]
        lags = (update - versions)[real]
        if lags.size:
            self._token_lag += [int(lags.sum()), lags.size, 0]
            self._token_lag[2] = max(self._token_lag[2], int(lags.max()))
        oldest = np.where(real, versions, np.iinfo(np.int32).max).min(axis=-1)
        newest = np.where(real, versions, -1).max(axis=-1)
        self._answers_across_versions += int(np.count_nonzero(oldest < newest))

    @property
    def accuracy(self) -> float:
        """The fraction of the window's episodes that met their goal (NaN before any ended)."""
        return float(np.mean(self._successes)) if self._successes else float("nan")

    def record(self, start_time: float) -> dict[str, Any]:
        """Fields of a metrics record: accuracy and token throughput since `start_time`."""
        elapsed = max(time.perf_counter() - start_time, 1e-9)
        terms: dict[str, Any] = {}
        for j, name in enumerate(self.reward_names):
            count = int(self._term_counts[j])
            terms[f"reward/{name}/mean"] = self._term_sums[j] / count if count else float("nan")
            terms[f"reward/{name}/failures"] = int(self._term_failures[j])
        self._term_sums[:], self._term_counts[:], self._term_failures[:] = 0.0, 0, 0
        lag_sum, lag_count, lag_max = self._token_lag.tolist()
        terms |= {
            "token_lag_mean": lag_sum / lag_count if lag_count else 0.0,
            "token_lag_max": lag_max,
            "answers_across_versions": self._answers_across_versions,
        }
        self._token_lag[:], self._answers_across_versions = 0, 0
        return terms | {
            "accuracy": self.accuracy,
            "tokens_generated": self._before_tokens.received + self.received_tokens,
            "tokens_trained": self._before_tokens.trained + self.trained_tokens,
            "tokens_generated_per_s": self.received_tokens / elapsed,
            "tokens_trained_per_s": self.trained_tokens / elapsed,
        }

    def reconcile(self, env_reports: Sequence[dict[str, Any]]) -> None:
        """The whole run's token and episode accounting from env ranks' final reports."""

        def total(key: str) -> int:
            return sum(int(r.get(key, 0)) for r in env_reports)

        self.tokens = self._before_tokens + Accounting(
            produced=total("produced_tokens"),
            sent=total("sent_tokens"),
            received=self.received_tokens + self.late_tokens,
            trained=self.trained_tokens,
            unsent=total("unsent_tokens"),
            late=self.late_tokens,
            discarded=self.discarded_tokens,
        )
        self.episodes = self._before_episodes + Accounting(
            produced=total("produced_episodes"),
            sent=total("sent_episodes"),
            received=self.received_episodes + self.late_episodes,
            trained=self.received_episodes - self.discarded_episodes,
            unsent=total("unsent_episodes"),
            late=self.late_episodes,
            discarded=self.discarded_episodes,
        )

    def summary(self) -> dict[str, Any]:
        """For `summary.json`: the accuracy and both accountings."""
        out: dict[str, Any] = {"accuracy": self.accuracy}
        if self.tokens is not None and self.episodes is not None:
            out |= {"token_accounting": self.tokens.as_dict()}
            out |= {"episode_accounting": self.episodes.as_dict()}
        return out

    def state(self) -> dict[str, Any]:
        """For a checkpoint's meta: what was trained on so far."""
        return {
            "tokens": self._before_tokens.trained + self.trained_tokens,
            "episodes": self._before_episodes.trained
            + self.received_episodes
            - self.discarded_episodes,
            "discarded_tokens": self._before_tokens.discarded + self.discarded_tokens,
            "discarded_episodes": self._before_episodes.discarded + self.discarded_episodes,
            "successes": list(self._successes),
        }

    def load(self, state: dict[str, Any]) -> None:
        # Like the transitions' (`Accounting.trained_so_far`): what a checkpoint carries
        # forward is what was trained on; the rest is stepped anew.
        self._before_tokens = Accounting.trained_so_far(
            int(state["tokens"]), int(state.get("discarded_tokens", 0))
        )
        self._before_episodes = Accounting.trained_so_far(
            int(state["episodes"]), int(state.get("discarded_episodes", 0))
        )
        self._successes.extend(state["successes"])
