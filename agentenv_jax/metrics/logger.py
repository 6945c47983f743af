"""Per-update JSONL records and the live progress line of the lead rank."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

if TYPE_CHECKING:
    from agentenv_jax.metrics.wandb_logger import WandbLogger


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic | np.ndarray):
        value = value.item() if np.ndim(value) == 0 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; "no episode finished yet" reads as null
    return value


def is_timing(key: str) -> bool:
    """Wall-clock quantities: they differ between otherwise identical runs (every rate, such
    as `steps_per_s` or a text run's `tokens_generated_per_s`, is one)."""
    return (
        key.startswith("time/")
        or key.endswith("_per_s")
        or key in ("wall_s", "steps_per_s_after_first_update")
    )


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric values of a JSON-ready record (no bools, no nulls): TensorBoard's and W&B's
    scalars."""
    return {
        key: value
        for key, value in record.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def require_tensorboard_writer() -> None:
    """`ConfigError` unless tensorboardX (the `tensorboard` extra) can be imported."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        from agentenv_jax.config.errors import ConfigError

        raise ConfigError(
            "run.tensorboard = True is not allowed here: it needs tensorboardX "
            "(pip install 'agentenv_jax[tensorboard]'), or set run.tensorboard=false"
        ) from None


class MetricsWriter:
    """Per-update records, one JSON object per line, flushed at once so a killed run keeps every
    record. What the run learned goes to `metrics.jsonl` — identical for identical synchronous
    runs — and how long it took to `timings.jsonl` (with the update number to join on). With a
    `tensorboard_dir`, every numeric value is also a TensorBoard scalar at step `env_steps`; with
    a `wandb` logger, the same scalars at the same steps go to its W&B run."""

    def __init__(
        self,
        path: Path,
        tensorboard_dir: Path | None = None,
        wandb: WandbLogger | None = None,
    ):
        self.path = Path(path)
        self.timings_path = self.path.with_name("timings.jsonl")
        self._tensorboard_dir = tensorboard_dir
        # Opened (for appending) at the first record, so a run that never starts leaves none.
        self._file: TextIO | None = None
        self._timings: TextIO | None = None
        self._tensorboard: Any = None
        self._wandb = wandb

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None or self._timings is None:
            self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed in close()
            self._timings = open(self.timings_path, "a", buffering=1)  # noqa: SIM115
            if self._tensorboard_dir is not None:
                from tensorboardX import SummaryWriter

                self._tensorboard = SummaryWriter(str(self._tensorboard_dir))
        metrics = {k: _jsonable(v) for k, v in record.items() if not is_timing(k)}
        timings = {"update": record.get("update")} | {
            k: _jsonable(v) for k, v in record.items() if is_timing(k)
        }
        self._file.write(json.dumps(metrics) + "\n")
        self._timings.write(json.dumps(timings) + "\n")
        if self._tensorboard is not None or self._wandb is not None:
            step = int(record["env_steps"])
            values = scalars(metrics | timings)
            if self._tensorboard is not None:
                for key, value in values.items():
                    self._tensorboard.add_scalar(key, value, step)
                self._tensorboard.flush()
            if self._wandb is not None:
                self._wandb.log(values, step)

    def close(self) -> None:
        for stream in (self._file, self._timings, self._tensorboard):
            if stream is not None:
                stream.close()
        if self._wandb is not None:
            self._wandb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def format_duration(seconds: float) -> str:
    """`m:ss`, or `h:mm:ss` from an hour on."""
    total = round(min(seconds, 99 * 3600.0))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress_fields(learner: Any, started: float, lengths: Sequence[int]) -> dict[str, Any]:
    """The fields every learner's per-update record starts with: its counters, the session's
    clock (from `started`, `time.perf_counter()`) and rates, and the means over the episode
    window (`lengths`: the lengths of its newest episodes)."""
    elapsed = time.perf_counter() - started
    return {
        "update": learner.updates,
        "env_steps": learner.env_steps,
        "episodes": learner.episodes,
        "wall_s": elapsed,
        # This session's rate: a resumed run's earlier steps took place in other processes.
        "steps_per_s": learner.session_env_steps / max(elapsed, 1e-9),
        "steps_per_s_after_first_update": learner.steady_rate.update(learner.session_env_steps),
        "episode_return_mean": learner.episode_return_mean,
        "episode_length_mean": float(np.mean(lengths)) if lengths else math.nan,
    }


class SteadyRate:
    """Env steps per second since the end of a session's first update: the rate once start-up
    and the first compilations are paid for (None until a later update)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._first: tuple[float, int] | None = None  # (time, session env steps)
        self.steps_per_s: float | None = None

    def update(self, session_env_steps: int) -> float | None:
        now = self._clock()
        if self._first is None:
            self._first = (now, session_env_steps)
        elif now > self._first[0]:
            self.steps_per_s = (session_env_steps - self._first[1]) / (now - self._first[0])
        return self.steps_per_s


class ProgressLine:
    """A rewritten line on a terminal; elsewhere (CI logs, files) a line every few seconds. The
    ETA is the time the rest of `run.total_env_steps` takes at the rate since the first update
    (which also paid for compiling), so the first line has none yet."""

    def __init__(
        self,
        total_env_steps: int,
        enabled: bool,
        interval_s: float,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._stream = stream or sys.stderr
        self._enabled = enabled
        self._tty = self._stream.isatty()
        self._interval = 0.2 if self._tty else interval_s
        self._total = total_env_steps
        self._clock = clock
        self._last = -math.inf
        self._first: tuple[float, int] | None = None  # (time, env steps) of the first update

    def _eta(self, now: float, env_steps: int) -> str:
        if self._first is None:
            self._first = (now, env_steps)
        first_time, first_steps = self._first
        if now <= first_time or env_steps <= first_steps:
            return "--"
        rate = (env_steps - first_steps) / (now - first_time)
        return format_duration(max(0, self._total - env_steps) / rate)

    def update(self, record: dict[str, Any], force: bool = False) -> None:
        now = self._clock()
        eta = self._eta(now, record["env_steps"])
        if not self._enabled or (not force and now - self._last < self._interval):
            return
        self._last = now
        ret = record.get("episode_return_mean")
        ret_text = "n/a" if ret is None or not math.isfinite(ret) else f"{ret:8.2f}"
        text = (
            f"update {record['update']:>6} | steps {record['env_steps']:>9,}/{self._total:,} | "
            f"{record['steps_per_s']:>9,.0f} steps/s | return {ret_text} | "
            f"lag {record['policy_lag_mean']:.2f} | eta {eta}"
        )
        accuracy = record.get("accuracy")
        if accuracy is not None:  # text envs: what LLM-RL users watch
            accuracy_text = f"{accuracy:.2f}" if math.isfinite(accuracy) else "n/a"
            text += (
                f" | accuracy {accuracy_text} | "
                f"{record.get('tokens_generated_per_s', 0.0):,.0f} tokens/s"
            )
        if self._tty:
            self._stream.write("\r" + text)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def close(self) -> None:
        if self._enabled and self._tty:
            self._stream.write("\n")
            self._stream.flush()
