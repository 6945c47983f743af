"""An MPI job (1 learner + N partitions) that checks sharded replay sampling; run by
tests/test_replay_sampling.py under `mpiexec -n 4`. Rank 0 prints one `RESULT {json}` line.

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
from agentenv_jax.roles import prepare_env_rank, replay_plan
from agentenv_jax.transport.messages import REPLAY_COUNTERS
from agentenv_jax.transport.topology import make_topology

FILL = {1: 40, 2: 120, 3: 260}  # env steps per partition; partition 3 wraps its ring of 100
SNAPSHOT_TAG = 99
BATCH = 64


def priority_of(item_id: np.ndarray) -> np.ndarray:
    return 0.5 + (item_id % 7).astype(np.float64)


def main() -> None:
    world = MPI.COMM_WORLD
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
        ],
    )
    topology = make_topology(config, world.Get_size(), world.Get_rank())
    if topology.is_learner:
        learner(config, topology, world)
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
        if not frozen and actor.produced >= FILL[topology.rank]:
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
                dest=0,
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


def learner(config, topology, world) -> None:
    from agentenv_jax.transport import messages
    from agentenv_jax.transport.mpi import MPIWorld

    spaces = prepare_env_rank(config, make_topology(config, 1, 0))[1]
    plan = replay_plan(config, topology, spaces)
    channel = plan.make_mpi_learner_channel(MPIWorld())
    channel.broadcast_params(plan.param_spec.allocate())  # version 0: zero actor weights
    request_spec = messages.sample_request_spec()
    answer_spec = messages.sample_answer_spec(BATCH, spaces.obs_shape, spaces.action_size)
    ranks = [topology.env_rank_of(i) for i in range(topology.num_env_ranks)]
    produced = REPLAY_COUNTERS.index("produced")
    inserted = REPLAY_COUNTERS.index("inserted")
    rng = np.random.default_rng(0)
    request_id = 0
    bad_rows = 0
    rows_checked = 0

    def check_rows(view, count, rank_index):
        nonlocal bad_rows, rows_checked
        obs, nxt = view["obs"][:count], view["next_obs"][:count]
        ok = (
            (nxt[:, 0] == obs[:, 0])
            & (nxt[:, 1] == obs[:, 1] + 1)
            & (view["reward"][:count] == obs[:, 1])
        )
        ok &= view["item_id"][:count] < view["counters"][inserted]
        ok &= view["item_id"][:count] >= 0
        first = topology.env_offsets[rank_index]
        env_ids = obs[:, 0] - config.run.seed * 1_000_003
        ok &= (env_ids >= first) & (env_ids < first + topology.local_num_envs[rank_index])
        bad_rows += int((~ok).sum())
        rows_checked += count

    # Fill each partition to its level through the allowance, then take the snapshots.
    zeros = np.zeros(len(ranks), np.int64)
    allowances = [FILL[r] for r in ranks]
    while True:
        request_id += 1
        answers = _request(request_spec, channel, zeros, allowances, request_id)
        views = [answer_spec.views(a) for a in answers]
        if all(int(v["counters"][produced]) >= FILL[r] for v, r in zip(views, ranks, strict=True)):
            break
    snapshots = {r: world.recv(source=r, tag=SNAPSHOT_TAG) for r in ranks}
    request_id += 1
    views = [
        answer_spec.views(a) for a in _request(request_spec, channel, zeros, allowances, request_id)
    ]
    masses = np.array([float(v["mass"][0]) for v in views])

    # Phase 1: frozen partitions, many batches; tally every (rank, item) drawn.
    tallies = {r: {} for r in ranks}
    rounds = 600
    for _ in range(rounds):
        counts = split_batch(BATCH, masses, rng)
        request_id += 1
        views = [
            answer_spec.views(a)
            for a in _request(request_spec, channel, counts, allowances, request_id)
        ]
        for i, (v, c) in enumerate(zip(views, counts, strict=True)):
            check_rows(v, c, i)
            for item in v["item_id"][:c].tolist():
                tallies[ranks[i]][item] = tallies[ranks[i]].get(item, 0) + 1
    priorities = np.concatenate([snapshots[r]["priority"] for r in ranks])
    expected = rounds * BATCH * priorities / priorities.sum()
    observed = np.array(
        [tallies[r].get(item, 0) for r in ranks for item in snapshots[r]["item_id"]], np.float64
    )
    chi2 = float(np.sum((observed - expected) ** 2 / expected))
    never_stored = sum(
        1 for r in ranks for item in tallies[r] if item not in set(snapshots[r]["item_id"])
    )

    # Phase 2: partitions insert while answering; new priorities flow back.
    priority_spec = messages.priority_update_spec(BATCH)
    for step in range(300):
        allowances = [FILL[r] + 4 * (step + 1) for r in ranks]
        counts = split_batch(BATCH, masses, rng)
        request_id += 1
        views = [
            answer_spec.views(a)
            for a in _request(request_spec, channel, counts, allowances, request_id)
        ]
        masses = np.array([float(v["mass"][0]) for v in views])
        for i, (v, c) in enumerate(zip(views, counts, strict=True)):
            check_rows(v, c, i)
            if c:
                message = priority_spec.allocate()
                fields = priority_spec.views(message)
                fields["count"][0] = c
                fields["slot"][:c] = v["slot"][:c]
                fields["generation"][:c] = v["generation"][:c]
                fields["td_error"][:c] = rng.random(c) * 3
                channel.send_priorities(i, message)
    channel.request_stop()
    reports, _ = channel.collect_final_reports(60.0)
    result = {
        "chi2": chi2,
        "df": len(priorities) - 1,
        "draws": rounds * BATCH,
        "never_stored": never_stored,
        "bad_rows": bad_rows,
        "rows_checked": rows_checked,
        "reports": reports,
        "stored_items": [len(snapshots[r]["item_id"]) for r in ranks],
    }
    print("RESULT " + json.dumps(result, default=int), flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
