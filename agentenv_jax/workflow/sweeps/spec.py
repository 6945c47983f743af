"""A sweep file, read and checked, and the trials it expands to (no processes, no training).

    name: cartpole_lr            # the sweep folder's name (default: the file's name)
    base: cartpole_ppo           # experiment file (relative to this file) or shipped name
    set: [run.total_env_steps=50000]   # overrides every trial shares
    method: grid                 # grid: every combination; random: `samples` draws
    parameters:                  # dotted config keys
      algorithm.learning_rate: [1.0e-3, 3.0e-4]      # grid: a list of values
      algorithm.clip_eps: {uniform: [0.1, 0.3]}      # random: uniform, log_uniform,
                                                     # int_uniform [low, high] or choice [...]
    seeds: 3                     # run.seed 0, 1, 2 (or a list); the seed axis of every config
    ranks: 1                     # 1: a trial is one process; N: an `mpiexec -n N` job
    parallel: 2                  # trials at once
    metric: episode_return_mean  # a summary.json or last metrics.jsonl key; higher is better
    goal: max                    # or min
    run_dir: runs                # the sweep folder is RUN_DIR/NAME

Trials are ordered seed by seed (every config's first seed, then every config's second), so
the trials of one config never compile at the same time: the later ones find the first one's
programs in the sweep's compilation cache.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.experiments import resolve_config_path, resolve_sweep_path
from agentenv_jax.config.loading import config_to_dict, load_config, read_yaml_mapping

Method = Literal["grid", "random"]
Goal = Literal["max", "min"]
DISTRIBUTIONS = ("uniform", "log_uniform", "int_uniform", "choice")
_KEYS = (
    "name",
    "base",
    "set",
    "method",
    "parameters",
    "samples",
    "sampler_seed",
    "seeds",
    "ranks",
    "parallel",
    "metric",
    "goal",
    "run_dir",
)
# Keys a sweep's trials must not vary: the sweep decides where each trial's run folder is.
_RESERVED = ("run.seed", "run.name", "run.run_dir", "run.compilation_cache_dir")


@dataclasses.dataclass(frozen=True)
class Distribution:
    """A random-search axis: `kind` over [low, high], or a choice among `values`."""

    kind: str
    low: float = 0.0
    high: float = 0.0
    values: tuple[Any, ...] = ()

    def sample(self, rng: np.random.Generator) -> Any:
        if self.kind == "choice":
            return self.values[int(rng.integers(len(self.values)))]
        if self.kind == "int_uniform":
            return int(rng.integers(int(self.low), int(self.high) + 1))
        if self.kind == "uniform":
            value = rng.uniform(self.low, self.high)
        else:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return float(f"{value:.4g}")  # 4 significant digits: names and values agree


Axis = tuple[Any, ...] | Distribution


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A checked sweep file (see the module docstring for the fields)."""

    name: str
    base: Path  # the base experiment file, resolved
    overrides: tuple[str, ...]
    method: Method
    parameters: tuple[tuple[str, Axis], ...]
    samples: int
    sampler_seed: int
    seeds: tuple[int, ...]
    ranks: int
    parallel: int
    metric: str
    goal: Goal
    run_dir: str

    @property
    def folder(self) -> Path:
        return Path(self.run_dir) / self.name

    def identity(self) -> dict[str, Any]:
        """What decides the trials and their results (not `parallel`, nor where the base file
        is): a resumed sweep must have the same."""
        return {
            "base_config": config_to_dict(load_config(self.base)),
            "overrides": list(self.overrides),
            "method": self.method,
            "parameters": {k: _plain(v) for k, v in self.parameters},
            "samples": self.samples,
            "sampler_seed": self.sampler_seed,
            "seeds": list(self.seeds),
            "ranks": self.ranks,
            "metric": self.metric,
        }


@dataclasses.dataclass(frozen=True)
class Trial:
    """One run of a sweep: config `config_index` (its parameter values) with one seed."""

    index: int
    config_index: int
    params: tuple[tuple[str, Any], ...]
    seed: int

    @property
    def name(self) -> str:
        """The run folder's name: config number, short parameter values, seed."""
        short = _short_names([k for k, _ in self.params])
        values = "-".join(f"{s}={_format(v)}" for s, (_, v) in zip(short, self.params, strict=True))
        values = re.sub(r"[^\w.=+,-]", "_", values)[:80]
        return f"c{self.config_index:02d}" + (f"-{values}" if values else "") + f"-seed{self.seed}"

    def overrides(self) -> list[str]:
        """The trial's `--set` overrides (on top of the sweep's own)."""
        return [f"{k}={json.dumps(v)}" for k, v in self.params] + [f"run.seed={self.seed}"]


def _plain(axis: Axis) -> Any:
    """An axis as it is written in a sweep file."""
    if isinstance(axis, Distribution):
        return {axis.kind: list(axis.values) if axis.kind == "choice" else [axis.low, axis.high]}
    return list(axis)


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return "x".join(_format(v) for v in value)
    return str(value)


def _short_names(keys: Sequence[str]) -> list[str]:
    """Each key's last part, or the whole key where two keys share their last part."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return [s if last.count(s) == 1 else k for s, k in zip(last, keys, strict=True)]


def _axis(file: str, key: str, raw: Any, method: Method) -> Axis:
    where = f"sweep file {file!r}: parameters.{key}"
    if isinstance(raw, list):
        if not raw:
            raise ConfigError(f"{where} = [] is not allowed: expected at least one value")
        return tuple(raw) if method == "grid" else Distribution("choice", values=tuple(raw))
    if isinstance(raw, dict) and len(raw) == 1:
        ((kind, args),) = raw.items()
        if kind not in DISTRIBUTIONS:
            raise ConfigError(
                f"{where}: distribution {kind!r} is not allowed: expected one of "
                f"{', '.join(DISTRIBUTIONS)}"
            )
        if method == "grid":
            raise ConfigError(
                f"{where} = {raw!r}: a distribution needs method: random (a grid takes a "
                "list of values)"
            )
        if kind == "choice":
            return _axis(file, key, args, "random")
        if not (
            isinstance(args, list)
            and len(args) == 2
            and all(isinstance(a, int | float) and not isinstance(a, bool) for a in args)
            and args[0] < args[1]
        ):
            raise ConfigError(f"{where}.{kind} = {args!r} is not allowed: expected [low, high]")
        if kind == "log_uniform" and args[0] <= 0:
            raise ConfigError(f"{where}.log_uniform = {args!r}: low must be > 0")
        return Distribution(kind, float(args[0]), float(args[1]))
    raise ConfigError(
        f"{where} = {raw!r} is not allowed: expected a list of values, or (method: random) "
        f"one of {{{', '.join(DISTRIBUTIONS)}: ...}}"
    )


def _integer(file: str, key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(
            f"sweep file {file!r}: {key} = {value!r} is not allowed: expected an integer "
            f">= {minimum}"
        )
    return value


def _choice(file: str, key: str, value: Any, allowed: Sequence[str]) -> Any:
    if value not in allowed:
        raise ConfigError(
            f"sweep file {file!r}: {key} = {value!r} is not allowed: expected one of "
            f"{', '.join(map(repr, allowed))}"
        )
    return value


def read_sweep(
    name_or_path: str | Path, overrides: Sequence[str] = (), parallel: int | None = None
) -> SweepSpec:
    """Read and check a sweep file (or a shipped sweep, by name). `overrides` are added to
    its `set` list; `parallel` replaces its `parallel`. `ConfigError` names the file, the
    field and what is allowed."""
    path = resolve_sweep_path(name_or_path)
    file = str(path)
    raw = read_yaml_mapping(path, "sweep file", "expected base, parameters and seeds")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ConfigError(
            f"sweep file {file!r}: unknown key {unknown[0]!r}; allowed: {', '.join(_KEYS)}"
        )
    if "base" not in raw:
        raise ConfigError(f"sweep file {file!r}: base is missing (an experiment file or name)")
    base_path = path.parent / str(raw["base"])
    base = resolve_config_path(base_path if base_path.is_file() else str(raw["base"]))
    method = _choice(file, "method", raw.get("method", "grid"), ("grid", "random"))
    parameters = raw.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ConfigError(f"sweep file {file!r}: parameters must map dotted keys to values")
    for key in parameters:
        if key in _RESERVED:
            raise ConfigError(
                f"sweep file {file!r}: parameters.{key}: the sweep sets {key} itself "
                "(use seeds for the seed axis)"
            )
    shared = raw.get("set") or []
    if not isinstance(shared, list) or not all(isinstance(s, str) for s in shared):
        raise ConfigError(f"sweep file {file!r}: set must be a list of 'key=value' strings")
    seeds = raw.get("seeds", 1)
    if isinstance(seeds, list):
        if not seeds or len(set(seeds)) != len(seeds):
            raise ConfigError(
                f"sweep file {file!r}: seeds = {seeds!r} is not allowed: expected distinct "
                "integers, or a count"
            )
        seeds = tuple(_integer(file, "seeds[]", s, 0) for s in seeds)
    else:
        seeds = tuple(range(_integer(file, "seeds", seeds, 1)))
    if method == "random" and "samples" not in raw:
        raise ConfigError(f"sweep file {file!r}: method: random needs samples (configs to draw)")
    spec = SweepSpec(
        name=str(raw.get("name", path.stem)),
        base=base,
        overrides=(*shared, *overrides),
        method=method,
        parameters=tuple((str(k), _axis(file, str(k), v, method)) for k, v in parameters.items()),
        samples=_integer(file, "samples", raw.get("samples", 1), 1),
        sampler_seed=_integer(file, "sampler_seed", raw.get("sampler_seed", 0), 0),
        seeds=seeds,
        ranks=_integer(file, "ranks", raw.get("ranks", 1), 1),
        parallel=_integer(
            file, "parallel", raw.get("parallel", 1) if parallel is None else parallel, 1
        ),
        metric=str(raw.get("metric", "episode_return_mean")),
        goal=_choice(file, "goal", raw.get("goal", "max"), ("max", "min")),
        run_dir=str(raw.get("run_dir", "runs")),
    )
    if "/" in spec.name or not spec.name.strip():
        raise ConfigError(f"sweep file {file!r}: name = {spec.name!r}: expected a folder name")
    return spec


def expand(spec: SweepSpec) -> list[Trial]:
    """Every trial of the sweep, seed-major (see the module docstring); the same spec always
    gives the same trials, random draws included."""
    if spec.method == "grid":
        configs: list[tuple[tuple[str, Any], ...]] = [()]
        for key, values in spec.parameters:
            configs = [(*c, (key, v)) for c in configs for v in values]  # type: ignore[union-attr]
    else:
        rng = np.random.default_rng(spec.sampler_seed)
        configs = [
            tuple((key, axis.sample(rng)) for key, axis in spec.parameters)  # type: ignore[union-attr]
            for _ in range(spec.samples)
        ]
    trials = []
    for seed in spec.seeds:
        for config_index, params in enumerate(configs):
            trials.append(Trial(len(trials), config_index, params, seed))
    return trials


def check_trials(spec: SweepSpec, trials: Sequence[Trial]) -> None:
    """Build every trial's config before any starts: a misspelt key or a bad value is one
    `ConfigError` naming the trial, not a failure halfway through the sweep."""
    for trial in trials:
        try:
            load_config(spec.base, [*spec.overrides, *trial.overrides()])
        except ConfigError as err:
            raise ConfigError(f"sweep {spec.name!r}, trial {trial.name}: {err}") from None
