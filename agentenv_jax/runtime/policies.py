"""Which policy each role acts with: the actor-critic (or language model) of a config, the
env rank's own copy (jitted, numpy for small MLPs, or generating text), the learner's copy
for central inference and the noise streams it keeps for each env rank, and central
inference's message layouts."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from agentenv_jax.config.schema import ExperimentConfig
from agentenv_jax.transport.topology import Topology

if TYPE_CHECKING:
    from agentenv_jax.envs.spaces import EnvSpaces


def uses_numpy_inference(config: ExperimentConfig, spaces: EnvSpaces, layout: Any) -> bool:
    """Whether env ranks run the policy in numpy (`topology.env_rank_inference`): asked for, or
    `auto` with an MLP torso small enough that numpy beats a jitted call. `EnvError` for numpy
    with a CNN torso."""
    import numpy as np

    from agentenv_jax.envs.factory import EnvError
    from agentenv_jax.networks.numpy_policy import NUMPY_MAX_MACS_PER_ROW, mlp_macs_per_row
    from agentenv_jax.networks.torso_choice import resolve_torso

    choice = config.topology.env_rank_inference
    mlp = resolve_torso(config.network.torso, spaces.is_image) == "mlp"
    if choice == "numpy" and not mlp:
        raise EnvError(
            "topology.env_rank_inference = 'numpy' is not allowed with a CNN torso "
            f"(network.torso = {config.network.torso!r}): expected 'jit' or 'auto'"
        )
    grouped = config.network.policies == "per_group" and len(spaces.group_names) > 1
    if choice == "numpy" and (grouped or spaces.agent_action_counts):
        raise EnvError(
            "topology.env_rank_inference = 'numpy' is not allowed with network.policies = "
            "'per_group' (one network per agent group) or agents with different action counts: "
            "expected 'jit' or 'auto'"
        )
    if grouped or spaces.agent_action_counts:
        return False
    if choice != "auto":
        return choice == "numpy"
    if not mlp:
        return False
    params = layout.unravel(np.zeros(layout.num_params, np.float32))
    return mlp_macs_per_row(params) <= NUMPY_MAX_MACS_PER_ROW


def build_actor_policy(config, topology, spaces, network=None, layout=None):
    """The actor-critic policy an env rank acts with (jitted, or numpy for small MLPs);
    `network` is `actor_critic_network(config, spaces)` when the caller already has it
    (tracing the parameter layout costs tens of ms). Given only the parameters' `layout`
    (`FlatLayout.from_leaf_paths`, from the learner), a numpy policy is built without
    importing JAX; the network is built only for a jitted or text policy."""
    from agentenv_jax.actor.numpy_policy import NumpyActorPolicy

    index = topology.env_rank_index
    if spaces.text is not None:
        from agentenv_jax.actor.text_policy import TextPolicy

        module, _, layout = network or actor_critic_network(config, spaces)
        return TextPolicy(
            module,
            layout.unravel,
            spaces.text,
            config.run.seed,
            topology.env_offsets[index],
            topology.local_num_envs[index],
            length_bucket=getattr(config.algorithm, "length_bucket", 0),
            generation_slots=config.network.language_model.generation_slots,
            partial_rollout_steps=getattr(config.algorithm, "partial_rollout_steps", 0),
        )
    if layout is None:
        network = network or actor_critic_network(config, spaces)
        layout = network[2]
    # Sampling noise is seeded by (seed, global env offset): independent across env ranks.
    seed_sequence = [config.run.seed, topology.env_offsets[index]]
    if uses_numpy_inference(config, spaces, layout):
        return NumpyActorPolicy(
            layout.unravel,
            spaces.action_kind,
            tuple(spaces.action_nvec),
            spaces.action_size,
            spaces.action_shape,
            seed_sequence,
            len(spaces.obs_shape),
            config.network.activation,
            spaces.is_image,
        )
    return jitted_policy(spaces, network or actor_critic_network(config, spaces), seed_sequence)


def env_rank_leaf_paths(config: ExperimentConfig, spaces) -> Any:
    """What an on-policy env rank needs to know of the parameters without building the network
    (the learner sends it at start-up): the flat layout's leaf paths and shapes
    (`FlatLayout.leaf_paths`), or None where its policy is built with JAX in any case (text
    models, SAC's squashed Gaussian)."""
    if spaces.text is not None or config.algorithm.name == "sac":
        return None
    return actor_critic_network(config, spaces)[2].leaf_paths()


def env_rank_uses_jax(config: ExperimentConfig, spaces, leaf_paths: Any) -> bool:
    """Whether an env rank's policy is built with JAX (so JAX's compilation cache is worth
    opening there), given the learner's `env_rank_leaf_paths`: not under central inference,
    nor with the numpy policy."""
    from agentenv_jax.networks.flat_params import FlatLayout

    if spaces.text is not None or config.algorithm.name == "sac":
        return True
    if config.topology.inference == "learner":
        return False
    if leaf_paths is None:
        return True
    return not uses_numpy_inference(config, spaces, FlatLayout.from_leaf_paths(leaf_paths))


def jitted_policy(spaces, network, seed_sequence, device=None):
    """The jitted `ActorPolicy` of an MLP or CNN actor-critic, drawing its noise from
    `seed_sequence`'s stream (None: every call brings its rows' noise), on `device` (the env
    rank's CPU by default)."""
    from agentenv_jax.actor.policy import ActorPolicy
    from agentenv_jax.networks import action_distribution

    _, apply_fn, layout = network
    return ActorPolicy(
        apply_fn,
        layout.unravel,
        action_distribution(spaces.action_kind, spaces.action_nvec),
        spaces.action_size,
        spaces.action_shape,
        seed_sequence,
        device,
    )


def build_central_policy(config, spaces, network, device):
    """The policy a learner acts with for its env ranks under central inference
    (`topology.inference: learner`): the env ranks' jitted policy, on the learner's `device`
    (numpy inference is for env ranks' CPUs)."""
    from agentenv_jax.actor.text_policy import TextPolicy

    module, _, layout = network
    if spaces.text is not None:
        return TextPolicy(
            module,
            layout.unravel,
            spaces.text,
            config.run.seed,
            0,
            0,
            device,
            length_bucket=getattr(config.algorithm, "length_bucket", 0),
            generation_slots=config.network.language_model.generation_slots,
        )
    # No stream of its own: every row's noise is its env rank's stream.
    return jitted_policy(spaces, network, None, device)


def central_noise_sources(config, topology, spaces, policy, env_indices):
    """Per env rank of `env_indices`, the noise its own policy would draw, for the learner's
    server: the same streams as env-rank inference."""
    if spaces.text is not None:
        return [
            policy.noise_source(topology.env_offsets[i], topology.local_num_envs[i] * spaces.agents)
            for i in env_indices
        ]
    return [
        functools.partial(
            policy.noise_source([config.run.seed, topology.env_offsets[i]]),
            topology.local_num_envs[i] * spaces.agents,
        )
        for i in env_indices
    ]


def actor_critic_network(config: ExperimentConfig, spaces):
    """The actor-critic module, its apply function and the layout of its flat parameters (on a
    text env: the `LanguageModel`, its `apply`, and its layout)."""
    from agentenv_jax.networks.flat_params import FlatLayout

    if spaces.text is not None:
        from agentenv_jax.networks.text_models import language_model_for

        lm = language_model_for(config.network.language_model, spaces.text)
        return lm, lm.apply, FlatLayout(lm.param_shapes())
    from agentenv_jax.networks import actor_critic_for
    from agentenv_jax.networks.actor_critic import actor_critic_param_shapes

    module, apply_fn = actor_critic_for(config.network, spaces)
    layout = FlatLayout(actor_critic_param_shapes(module, spaces.obs_shape))
    return module, apply_fn, layout


def inference_specs(spaces, topology: Topology) -> list[tuple[Any, Any]]:
    """Each env rank's central-inference (request, reply) layouts."""

    from agentenv_jax.transport.messages import inference_reply_spec, inference_request_spec

    per_token = () if spaces.text is None else (spaces.text.response_length,)
    return [
        (
            inference_request_spec(
                spaces.obs_shape, spaces.obs_dtype, n * spaces.agents, spaces.text is not None
            ),
            inference_reply_spec(
                spaces.action_shape, spaces.action_dtype, per_token, n * spaces.agents
            ),
        )
        for n in topology.local_num_envs
    ]
