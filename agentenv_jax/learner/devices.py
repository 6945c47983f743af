"""How many local devices each learner process puts in its mesh: the configured count (or
mesh shape), capped by what the process sees and by what divides the update's batches."""

from __future__ import annotations

from agentenv_jax.config.schema import ExperimentConfig


def learner_devices(config: ExperimentConfig, processes: int = 1) -> int:
    """How many local devices each of the `processes` learner processes puts in the mesh."""
    import jax

    from agentenv_jax.learner.on_policy_model import minibatch_size
    from agentenv_jax.parallel.mesh import choose_mesh_devices, choose_num_devices

    if config.algorithm.name == "sac":
        batch_sizes = [config.algorithm.batch_size]
    else:
        batch_sizes = [config.env.global_num_envs, minibatch_size(config)]
    available = len(jax.local_devices())
    if config.topology.mesh:
        return choose_mesh_devices(
            config.topology.data_axis,
            config.topology.model_axis,
            available,
            batch_sizes,
            processes,
        )
    return choose_num_devices(config.topology.learner_devices, available, batch_sizes, processes)
