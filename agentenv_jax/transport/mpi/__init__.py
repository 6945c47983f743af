"""The MPI transport: the only package of agentenv_jax that imports mpi4py.

Hot-path messages (segments, parameters, credits, sample requests and answers, priorities) are
fixed-layout numpy buffers moved with the upper-case buffer API (`Isend`/`Irecv`); only
start-up, stop and final reports are pickled. `world` starts MPI and holds the waiting every
channel shares; `on_policy` and `replay` hold the two families' channels.
"""

from agentenv_jax.transport.launcher import LaunchError

try:
    # mpi4py loads its MPI library on this first import; say here what to install if none is.
    from mpi4py import MPI  # noqa: F401
except RuntimeError as err:
    raise LaunchError(
        f"mpi4py found no MPI library ({' '.join(str(err).split())}): on a laptop pip install "
        "'agentenv_jax[mpich]'; on a cluster load the site's MPI (module load ...) or set "
        "MPI4PY_LIBMPI=/path/to/libmpi.so (docs/cluster.md)"
    ) from err
from agentenv_jax.transport.mpi.on_policy import MPIActorChannel, MPILearnerChannel
from agentenv_jax.transport.mpi.replay import MPIReplayActorChannel, MPIReplayLearnerChannel
from agentenv_jax.transport.mpi.world import MPIWorld, mpi_library

__all__ = [
    "MPIActorChannel",
    "MPILearnerChannel",
    "MPIReplayActorChannel",
    "MPIReplayLearnerChannel",
    "MPIWorld",
    "mpi_library",
]
