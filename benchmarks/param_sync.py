"""Parameter sync from one learner to N env ranks: MPI broadcast (`topology.param_sync:
broadcast`) against one send per env rank (`point_to_point`, the scheme before it), in one run.

For each env-rank count N of `--env-ranks` the script runs itself as `mpiexec -n 1+N`; rank 0
is the learner and sends `--syncs` versioned messages of each size of `--mb` through the
transport's own senders and receivers (`transport/mpi/params.py`), both schemes taking turns
sync by sync. A sync starts at a barrier: the learner notes the time, sends, and polls until
its own requests have completed (its buffer is free again: "learner s", the time a learner
that waits on the sync spends in it); each env rank polls with the transport's back-off until
the message is whole and notes the time ("all ranks s": from the send to the last env rank's).
Clocks are `time.monotonic`, one clock for every process of this host. Medians over syncs.
The ratio is broadcast / point-to-point of the learner's seconds (goal: <= 0.5 at 15 env
ranks and 100 MB). Every process shares this machine's cores (16 processes on 2 at N = 15),
which is the oversubscribed case the framework's env ranks run in here.

Memory: each env rank holds two copies of a message and the learner two, so 500 MB is run up
to 7 env ranks only (`--max-gb` bounds the total).

    python benchmarks/param_sync.py                                    # ~5 min here
    python benchmarks/param_sync.py --env-ranks 3 --mb 1 --syncs 5     # smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import common
import numpy as np

GOAL = 0.5
RESULT_PREFIX = "PARAM_SYNC_RESULT "
SCHEMES = ("point_to_point", "broadcast")


def rank_work(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    from agentenv_jax.transport.mpi import params
    from agentenv_jax.transport.mpi.world import wait_until

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    for mb in args.mb:
        nbytes = int(mb * 1e6)
        if 2 * nbytes * size > args.max_gb * 1e9:
            continue
        group = world.Split(color=0, key=rank)
        comm = world.Dup()
        if rank == 0:
            senders = {
                "point_to_point": params.ParamBroadcast(comm, list(range(1, size)), nbytes),
                "broadcast": params.TreeParamBroadcast(group, nbytes),
            }
            message = np.random.default_rng(0).integers(0, 256, nbytes, np.uint8)
        else:
            inboxes = {
                "point_to_point": params.ParamInbox(comm, 0, nbytes),
                "broadcast": params.TreeParamInbox(group, nbytes),
            }
        timings: dict[str, list[tuple[float, float]]] = {s: [] for s in SCHEMES}
        for _ in range(args.syncs):
            for scheme in SCHEMES:
                wait_until(world.Ibarrier().Test, args.timeout, lambda: "every rank")
                if rank == 0:
                    sender = senders[scheme]
                    started = time.monotonic()
                    sender.send(message)
                    pending = sender.pending()
                    wait_until(
                        lambda p=pending: MPI.Request.Testall(p),
                        args.timeout,
                        lambda: "the sends",
                    )
                    learner_s = time.monotonic() - started
                    arrivals = world.gather(0.0, root=0)[1:]
                    timings[scheme].append((learner_s, max(arrivals) - started))
                else:
                    inbox = inboxes[scheme]
                    wait_until(
                        lambda i=inbox: i.poll() is not None, args.timeout, lambda: "the message"
                    )
                    world.gather(time.monotonic(), root=0)
        # Stop as a run does: the broadcast's closing message, the posted receives withdrawn.
        if rank == 0:
            senders["broadcast"].close()
            for sender in senders.values():
                pending = sender.pending()
                wait_until(lambda p=pending: MPI.Request.Testall(p), args.timeout, lambda: "end")
        else:
            closing = inboxes["broadcast"]
            wait_until(lambda i=closing: i.done(0), args.timeout, lambda: "the closing message")
            inboxes["point_to_point"].close()
        wait_until(world.Ibarrier().Test, args.timeout, lambda: "every rank")
        comm.Free()
        group.Free()
        if rank == 0:
            result = {"env_ranks": size - 1, "mb": mb}
            for scheme, pairs in timings.items():
                result[scheme] = {
                    "learner_s": statistics.median(p[0] for p in pairs),
                    "all_ranks_s": statistics.median(p[1] for p in pairs),
                }
            print(RESULT_PREFIX + json.dumps(result), flush=True)


def main() -> None:
    parser = common.make_parser(__doc__)
    parser.add_argument("--env-ranks", type=int, nargs="+", default=[3, 7, 15])
    parser.add_argument("--mb", type=float, nargs="+", default=[1, 100, 500])
    parser.add_argument("--syncs", type=int, default=7, help="syncs per scheme and case")
    parser.add_argument("--max-gb", type=float, default=8.0, help="memory bound of a case")
    common.add_mpi_job_arguments(parser, job_timeout_s=1800.0)
    args = parser.parse_args()
    if common.work_if_rank(args, rank_work):
        return
    print(
        f"parameter sync, learner -> N env ranks, {args.syncs} syncs per case and scheme "
        f"(medians); goal: broadcast / point-to-point learner s <= {GOAL} at 15 ranks, 100 MB"
    )
    print(common.provenance(), flush=True)
    results: list[dict[str, Any]] = []
    for ranks in args.env_ranks:
        results += common.run_self_under_mpiexec(
            __file__, 1 + ranks, RESULT_PREFIX, args.job_timeout
        )
    common.print_header(
        f"{'env ranks':>9} | {'MB':>5} | {'p2p learner s':>13} | {'bcast learner s':>15} | "
        f"{'ratio':>7} | {'p2p all ranks s':>15} | {'bcast all ranks s':>17}"
    )
    for r in results:
        p2p, bcast = r["point_to_point"], r["broadcast"]
        ratio = bcast["learner_s"] / p2p["learner_s"]
        judged = r["env_ranks"] == 15 and r["mb"] == 100
        mark = (" ok" if ratio <= GOAL else " MISS") if judged else ""
        print(
            f"{r['env_ranks']:>9} | {r['mb']:>5g} | {p2p['learner_s']:13.4f} | "
            f"{bcast['learner_s']:15.4f} | {ratio:7.2f}{mark} | {p2p['all_ranks_s']:15.4f} | "
            f"{bcast['all_ranks_s']:17.4f}"
        )
    common.save_json(args.json, {"provenance": common.provenance(), "results": results})


if __name__ == "__main__":
    main()
