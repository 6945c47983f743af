"""The scaling model of `scaling_model.py`: synchronous PPO's env steps/s predicted from unit
costs measured on their own, as pure functions (docs/scaling.md explains it)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class UnitCosts:
    """The measured unit costs the model is built from (seconds, unless said otherwise)."""

    step_s: float  # one slow env step: its sleep as the OS ends it + CartPole
    vec_cpu_s: float  # CPU of one vector step of an env rank's envs, their sleeps left out
    policy_s: float  # one policy call (a vector step's actions) on an env rank
    msg_s: float  # per round: segment and parameter messages, bookkeeping of both sides
    update_fixed_s: float  # the update's cost alone: update_fixed_s + update_row_s * rows
    update_row_s: float
    pollers: list[int]  # the update's slowdown with this many env ranks waiting (polling) ...
    slowdown: list[float]  # ... is this (1 with none)
    allreduce_s: float  # one all-reduce of the gradient across 2 learner processes
    latency_s: float  # one all-reduce of 1 float across 2 learner processes
    collectives: int  # collective operations per update on 2 learner processes
    grad_steps: int  # gradient steps per update
    cores: int  # the cores the job's processes share


SLOWDOWN_IS_CPU_SHARED = 1.25  # a bottleneck "learner" slowed more than this is "CPU-shared"


def predict(
    env_ranks: int, envs_per_rank: int, t_len: int, u: UnitCosts, learners: int = 1
) -> dict[str, Any]:
    """Predicted env steps/s of synchronous PPO (max_policy_lag 0) with N = `env_ranks` env ranks
    of E = `envs_per_rank` envs each and T = `t_len`, all processes on `u.cores` cores:

        rows      = N * E * T                                  rows per round (one update)
        env_alone = T * (E * step_s + policy_s)                a segment, on a core of its own
        env_cpu   = N * T * (vec_cpu_s + policy_s) / cores     the env ranks' CPU work of a
                                                               round on the shared cores (a
                                                               rank asleep in its env uses none)
        env_phase = max(env_alone, env_cpu)
        update    = (update_fixed_s + update_row_s * rows) * slowdown(N)
                    slowdown(N): the update's measured slowdown while N env ranks wait for its
                    parameters, polling (1 with none; interpolated between the measured N)
        learner   = update + msg_s
                    (+ collectives * latency_s + grad_steps * (allreduce_s - latency_s)
                     with 2 learner processes: each collective's latency, and the gradient's
                     bytes once per gradient step; not exercised by one learner)
        round     = env_phase + learner                        no overlap: the env ranks wait
                                                               for the new parameters
        steps/s   = rows / round

    The bottleneck is the larger phase: "env" (its sleeps: env_alone >= env_cpu), "env CPU"
    (env_cpu > env_alone), "learner", or "learner, CPU-shared" (slowed > 1.25x by the polling
    env ranks). Not modelled: the slowest of N ranks sets the round (stragglers, sleeps that
    end late on busy cores) and the learner's bookkeeping per env rank (msg_s is measured with
    one)."""
    rows = env_ranks * envs_per_rank * t_len
    env_alone = t_len * (envs_per_rank * u.step_s + u.policy_s)
    env_cpu = env_ranks * t_len * (u.vec_cpu_s + u.policy_s) / u.cores
    env_phase = max(env_alone, env_cpu)
    slowdown = float(np.interp(env_ranks, u.pollers, u.slowdown))
    update = (u.update_fixed_s + u.update_row_s * rows) * slowdown
    learner = update + u.msg_s
    if learners > 1:
        learner += u.collectives * u.latency_s + u.grad_steps * (u.allreduce_s - u.latency_s)
    round_s = env_phase + learner
    if learner > env_phase:
        shared = slowdown > SLOWDOWN_IS_CPU_SHARED
        bottleneck = "learner, CPU-shared" if shared else "learner"
    else:
        bottleneck = "env" if env_alone >= env_cpu else "env CPU"
    return {
        "rows": rows,
        "env_alone_s": env_alone,
        "env_cpu_s": env_cpu,
        "env_phase_s": env_phase,
        "slowdown": slowdown,
        "update_s": update,
        "learner_s": learner,
        "round_s": round_s,
        "steps_per_s": rows / round_s,
        "bottleneck": bottleneck,
    }


def bottleneck_shifts(
    envs_per_rank: int, t_len: int, u: UnitCosts, up_to: int = 256
) -> list[tuple[int, str]]:
    """The env-rank counts (1..up_to) at which the model's bottleneck changes, and to what
    (past the largest N measured, the update's slowdown is held at its last value)."""
    shifts: list[tuple[int, str]] = []
    for n in range(1, up_to + 1):
        bottleneck = predict(n, envs_per_rank, t_len, u)["bottleneck"]
        if not shifts or shifts[-1][1] != bottleneck:
            shifts.append((n, bottleneck))
    return shifts


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Intercept and slope of the line with the least squared relative errors (so that small
    batches, whose updates are short, count as much as big ones)."""
    y = np.asarray(ys, float)
    slope, intercept = np.polyfit(np.asarray(xs, float), y, 1, w=1 / y)
    return float(intercept), float(slope)
