"""The process runtime: what one process of a run does and how the processes start, agree and stop.

`launch` is the driver (one process, an MPI job, or one JAX-env learner); `roles` builds an env
rank or a learner from the config, `policies` the policy each acts with; `mpi_job` starts an
`mpiexec` job from Python, `supervisor` is each rank's parent under a launcher, and `doctor`
reports what this machine offers.
"""
