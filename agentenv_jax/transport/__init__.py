"""Moving experience and parameters between ranks: message specs, topology, and the in-process
and MPI transports. `transport.mpi` is the only package that imports mpi4py."""
