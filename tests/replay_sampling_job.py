"""An MPI job (1 or 2 learners + 3 partitions) that checks sharded replay sampling; run by
tests/test_replay_sampling.py as `mpiexec -n 4 ... replay_sampling_job.py` (one learner) and
`mpiexec -n 5 ... replay_sampling_job.py 2` (two). Rank 0 prints one `RESULT {json}` line.

With two learners each serves its own partitions (env rank i feeds learner i % 2): the learners
exchange every answer each round (as `ReplayLearner` does), draw the same split over all
partitions from the same generator, and each asks its own partitions for their counts; the
union of what both drew is held against the global priority distribution.

It drives the package's real pieces: `ReplayActor` serving from its `ReplayPartition` on each env
rank, the MPI replay channels, and `split_batch` on the learner.
Phase 1 freezes the partitions (different fill levels and priorities) and compares the
empirical distribution of sampled items with the global priority distribution. Phase 2 lets the
partitions keep inserting while they answer requests and take new priorities, and checks every
returned row against what the env produced, then the accounting.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI

from agentenv_jax.buffers.replay import split_batch
from agentenv_jax.config import load_config
from agentenv_jax.runtime.roles import prepare_env_rank, replay_plan
from agentenv_jax.transport.messages import REPLAY_COUNTERS
from agentenv_jax.transport.topology import make_topology

# Env steps per partition (by env-rank index); partition 2 wraps its ring of 100.
FILL = {0: 40, 1: 120, 2: 260}
SNAPSHOT_TAG = 99
BATCH = 64


def priority_of(item_id: np.ndarray) -> np.ndarray:
    return 0.5 + (item_id % 7).astype(np.float64)


def main() -> None:
    world = MPI.COMM_WORLD
    learners = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    config = load_config(
        None,
        [
            "algorithm.name=sac",
            "env.id=envs_for_tests:counter_env",
            "env.global_num_envs=6",
            "algorithm.replay_capacity=300",
            "algorithm.prioritized=true",
            "algorithm.priority_alpha=1.0",
            f"algorithm.batch_size={BATCH}",
            "algorithm.learning_starts=1",
            "run.transport_timeout_s=60",
            f"topology.num_learner_ranks={learners}",
        ],
    )
    topology = make_topology(config, world.Get_size(), world.Get_rank())
    group = None
    if learners > 1:  # every rank takes part in the split
        from agentenv_jax.transport.mpi import MPIWorld
        from agentenv_jax.transport.mpi.learners import split_learner_group

        group = split_learner_group(MPIWorld(), learners)
    if topology.is_learner:
        learner(config, topology, world, group)
    else:
        partition(config, topology, world)


def partition(config, topology, world) -> None:
    from agentenv_jax.transport.mpi import MPIWorld

    vector_env, spaces = prepare_env_rank(config, topology)
    plan = replay_plan(config, topology, spaces)
    actor = plan.make_actor(vector_env, plan.make_mpi_actor_channel(MPIWorld()))
    store = actor._partition
    frozen = False
    while actor.run_once():
        if not frozen and actor.produced >= FILL[topology.env_rank_index]:
            # Distinct priorities per item, set before any further request is served.
            slots = np.arange(store.size)
            store.update_priorities(
                slots, store.generation[slots], priority_of(store.item_id[slots])
            )
            world.send(
                {
                    "item_id": store.item_id[slots].tolist(),
                    "priority": store.tree[store.tree.shape[0] // 2 + slots].tolist(),
                },
                dest=topology.learner_of(topology.env_rank_index),
                tag=SNAPSHOT_TAG,
            )
            frozen = True
    actor.finish()


def _request(plan_specs, channel, counts, allowances, request_id):
    request_spec = plan_specs
    messages = []
    for count, allowance in zip(counts, allowances, strict=True):
        message = request_spec.allocate()
        fields = request_spec.views(message)
        fields["request_id"][0] = request_id
        fields["count"][0] = count
        fields["insert_allowance"][0] = allowance
        messages.append(message)
    channel.send_requests(messages)
    return channel.wait_answers(60.0)


def learner(config, topology, world, group) -> None:
    from agentenv_jax.transport import messages
    from agentenv_jax.transport.mpi import MPIWorld

    spaces = prepare_env_rank(config, make_topology(config, 1, 0))[1]
    plan = replay_plan(config, topology, spaces)
    channel = plan.make_mpi_learner_channel(MPIWorld())
    channel.broadcast_params(plan.param_spec.allocate())  # version 0: zero actor weights
    request_spec = messages.sample_request_spec()
    answer_spec = messages.sample_answer_spec(BATCH, spaces.obs_shape, spaces.action_size)
    # Partitions by env-rank index, learner-major; this learner's own are one block of them.
    order = topology.learner_major()
    own = topology.env_ranks_of(topology.learner_index)
    first = order.index(own[0])
    mine = slice(first, first + len(own))
    produced = REPLAY_COUNTERS.index("produced")
    inserted = REPLAY_COUNTERS.index("inserted")
    rng = np.random.default_rng(0)  # the same draws on every learner
    request_id = 0
    bad_rows = 0
    rows_checked = 0

    def check_rows(view, count, index):
        nonlocal bad_rows, rows_checked
        obs, nxt = view["obs"][:count], view["next_obs"][:count]
        ok = (
            (nxt[:, 0] == obs[:, 0])
            & (nxt[:, 1] == obs[:, 1] + 1)
            & (view["reward"][:count] == obs[:, 1])
        )
        ok &= view["item_id"][:count] < view["counters"][inserted]
        ok &= view["item_id"][:count] >= 0
        first = topology.env_offsets[index]
        env_ids = obs[:, 0] - config.run.seed * 1_000_003
        ok &= (env_ids >= first) & (env_ids < first + topology.local_num_envs[index])
        bad_rows += int((~ok).sum())
        rows_checked += count

    def ask(counts, allowances):
        """Ask this learner's partitions for their part of the global `counts`; every
        partition's answer (views, learner-major order)."""
        nonlocal request_id
        request_id += 1
        answers = _request(request_spec, channel, counts[mine], allowances[mine], request_id)
        if group is not None:
            size = answer_spec.nbytes
            answers = [
                block[start : start + size]
                for block in group.exchange(np.concatenate(answers))
                for start in range(0, len(block), size)
            ]
        return [answer_spec.views(a) for a in answers]

    # Fill each partition to its level through the allowance, then take the snapshots.
    zeros = np.zeros(len(order), np.int64)
    allowances = np.array([FILL[i] for i in order])
    while True:
        views = ask(zeros, allowances)
        if all(int(v["counters"][produced]) >= FILL[i] for v, i in zip(views, order, strict=True)):
            break
    snapshots = {i: world.recv(source=topology.env_rank_of(i), tag=SNAPSHOT_TAG) for i in own}
    views = ask(zeros, allowances)
    masses = np.array([float(v["mass"][0]) for v in views])

    # Phase 1: frozen partitions, many batches; tally every (partition, item) drawn here.
    tallies = {i: {} for i in own}
    rounds = 600
    for _ in range(rounds):
        counts = split_batch(BATCH, masses, rng)
        views = ask(counts, allowances)
        for index, v, c in zip(order, views, counts, strict=True):
            if index in own:
                check_rows(v, c, index)
                for item in v["item_id"][:c].tolist():
                    tallies[index][item] = tallies[index].get(item, 0) + 1

    # Phase 2: partitions insert while answering; new priorities flow back.
    priority_spec = messages.priority_update_spec(BATCH)
    for step in range(300):
        allowances = np.array([FILL[i] + 4 * (step + 1) for i in order])
        counts = split_batch(BATCH, masses, rng)
        views = ask(counts, allowances)
        masses = np.array([float(v["mass"][0]) for v in views])
        for index, v, c in zip(order, views, counts, strict=True):
            if index not in own:
                continue
            check_rows(v, c, index)
            if c:
                message = priority_spec.allocate()
                fields = priority_spec.views(message)
                fields["count"][0] = c
                fields["slot"][:c] = v["slot"][:c]
                fields["generation"][:c] = v["generation"][:c]
                fields["td_error"][:c] = rng.random(c) * 3
                channel.send_priorities(own.index(index), message)
    channel.request_stop()
    reports, _ = channel.collect_final_reports(60.0)
    mine_all = (snapshots, tallies, reports, bad_rows, rows_checked)
    everyone = [mine_all] if group is None else group.allgather(mine_all)
    if topology.learner_index != 0:
        return
    snapshots = {i: s for part in everyone for i, s in part[0].items()}
    tallies = {i: t for part in everyone for i, t in part[1].items()}
    reports = [r for part in everyone for r in part[2]]
    bad_rows = sum(part[3] for part in everyone)
    rows_checked = sum(part[4] for part in everyone)
    indices = sorted(snapshots)
    priorities = np.concatenate([snapshots[i]["priority"] for i in indices])
    expected = rounds * BATCH * priorities / priorities.sum()
    observed = np.array(
        [tallies[i].get(item, 0) for i in indices for item in snapshots[i]["item_id"]], np.float64
    )
    chi2 = float(np.sum((observed - expected) ** 2 / expected))
    never_stored = sum(
        1 for i in indices for item in tallies[i] if item not in set(snapshots[i]["item_id"])
    )
    result = {
        "learners": 1 if group is None else group.size,
        "chi2": chi2,
        "df": len(priorities) - 1,
        "draws": rounds * BATCH,
        "drawn": int(observed.sum()),
        "never_stored": never_stored,
        "bad_rows": bad_rows,
        "rows_checked": rows_checked,
        "reports": reports,
        "stored_items": [len(snapshots[i]["item_id"]) for i in indices],
    }
    print("RESULT " + json.dumps(result, default=int), flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
