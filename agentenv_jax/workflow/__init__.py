"""The user's workflow: the Python API and the `agentenv` command, evaluation of every kind
(Gymnasium, JAX-resident and text envs), sweeps, Slurm batch scripts and plots.
"""
