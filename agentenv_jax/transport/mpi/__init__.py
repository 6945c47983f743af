"""The MPI transport: the only package of agentenv_jax that imports mpi4py.

Hot-path messages (segments, parameters, credits, sample requests and answers, priorities) are
fixed-layout numpy buffers moved with the upper-case buffer API (`Isend`/`Irecv`); only
start-up, stop and final reports are pickled. `world` starts MPI and holds the waiting every
channel shares; `on_policy` and `replay` hold the two families' channels.
"""

from agentenv_jax.transport.mpi.on_policy import MPIActorChannel, MPILearnerChannel
from agentenv_jax.transport.mpi.replay import MPIReplayActorChannel, MPIReplayLearnerChannel
from agentenv_jax.transport.mpi.world import MPIWorld

__all__ = [
    "MPIActorChannel",
    "MPILearnerChannel",
    "MPIReplayActorChannel",
    "MPIReplayLearnerChannel",
    "MPIWorld",
]
