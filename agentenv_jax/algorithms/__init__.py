"""Pure algorithm code: return estimators, losses and jit-able update steps. No I/O, no MPI."""
