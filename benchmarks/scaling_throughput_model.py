"""The scaling model of `scaling_model.py`: synchronous PPO's env steps/s predicted from unit
costs measured on their own, as pure functions (docs/scaling.md explains it)."""

from __future__ import annotations

import dataclasses
import math
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
        update    = (update_fixed_s + update_row_s * rows / L) * slowdown(N)
                    L = `learners`, each updating on its block of the rows;
                    slowdown(N): the update's measured slowdown while N env ranks wait for its
                    parameters, polling (1 with none; interpolated between the measured N)
        learner   = update + msg_s
                    (+ collectives * latency_s + grad_steps * (allreduce_s - latency_s)
                     with 2 learner processes: each collective's latency, and the gradient's
                     bytes once per gradient step; with one_psum, 20 steps: 20 gradient
                     all-reduces and 1 for the minibatches' statistics)
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
    update = (u.update_fixed_s + u.update_row_s * rows / learners) * slowdown
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


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What the projection assumes of a cluster, beyond the unit costs measured here: env
    ranks one per core on CPU hosts (no core shared with a learner), each learner on a host of
    its own (no polling slows its update), hosts joined by `link_gbps` links."""

    link_gbps: float = 100.0  # per host (100 Gb/s InfiniBand or Ethernet)
    segment_s: float = 6.5e-6  # learner's cost per segment message (transport_efficiency.py)


def sync_seconds(params: int, ranks: int, link_gbps: float, broadcast: bool) -> float:
    """The learner's seconds to send `params` float32 parameters to `ranks` env ranks on other
    hosts: a pipelined broadcast moves about twice the bytes through the learner's link,
    whatever the number of ranks (scatter, then ring all-gather); one send per rank moves them
    once per rank."""
    seconds_per_copy = 4 * params / (link_gbps * 1e9 / 8)
    return (2.0 if broadcast else float(ranks)) * seconds_per_copy


def project(
    learners: int,
    env_ranks: int,
    envs_per_rank: int,
    t_len: int,
    u: UnitCosts,
    cluster: Cluster,
    params: int,
) -> dict[str, Any]:
    """`predict` for a cluster (`Cluster`): N env ranks over L learners, each learner with
    its own host and devices (the update's rows split L ways), every env rank on a core of its
    own, so

        env_phase = T * (E * step_s + policy_s)           no core is shared
        update    = update_fixed_s + update_row_s * rows / L
        reduce    = grad_steps * allreduce_s * ceil(log2 L) + latency_s   (L > 1; the measured
                    2-process all-reduce, times the depth of a tree over L hosts)
        messages  = msg_s + (N / L - 1) * segment_s        a learner's own env ranks' segments
        sync      = sync_seconds(params, N / L, link, broadcast)          per update
        round     = env_phase + update + reduce + messages + sync

    `params` is the policy's parameter count for the sync (the update's cost stays the
    measured 64x64 MLP's: the sync is what a 135 M or 1 B policy adds to the round, not its
    update). Both sync schemes are given; the round takes the broadcast."""
    rows = env_ranks * envs_per_rank * t_len
    env_phase = t_len * (envs_per_rank * u.step_s + u.policy_s)
    update = u.update_fixed_s + u.update_row_s * rows / learners
    reduce = 0.0
    if learners > 1:
        reduce = u.grad_steps * u.allreduce_s * math.ceil(math.log2(learners)) + u.latency_s
    per_learner = env_ranks / learners
    messages = u.msg_s + max(per_learner - 1, 0) * cluster.segment_s
    sync = sync_seconds(params, math.ceil(per_learner), cluster.link_gbps, True)
    sends = sync_seconds(params, math.ceil(per_learner), cluster.link_gbps, False)
    learner = update + reduce + messages + sync
    parts = {"env": env_phase, "update": update, "all-reduce": reduce, "param sync": sync}
    round_s = env_phase + learner
    return {
        "rows": rows,
        "env_phase_s": env_phase,
        "update_s": update,
        "reduce_s": reduce,
        "messages_s": messages,
        "sync_s": sync,
        "sends_s": sends,
        "round_s": round_s,
        "steps_per_s": rows / round_s,
        "bottleneck": max(parts, key=parts.get),
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
