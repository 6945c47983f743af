"""How an experiment's two roles are built: the env rank's vector env and actor, the learner's
devices, and the plan that joins them over a transport (on-policy segment queues for PPO and
IMPALA, replay partitions for SAC). `launch` drives these; benchmarks and test jobs build the
same pieces to measure or probe them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentenv_jax.config.schema import ExperimentConfig
from agentenv_jax.config.sizes import check_memory
from agentenv_jax.runtime.policies import (
    actor_critic_network,
    build_actor_policy,
    build_central_policy,
    central_noise_sources,
    inference_specs,
)
from agentenv_jax.transport.topology import Topology

if TYPE_CHECKING:  # like the other heavy imports here, only where used
    from agentenv_jax.envs.spaces import EnvSpaces


def single_threaded_xla() -> None:
    """Make XLA's CPU backend single-threaded in this process (an env rank).

    Env ranks' inference calls are tiny; a multi-threaded Eigen pool per rank only oversubscribes
    the cores that step the envs. XLA reads the flag when its backend starts, so this must run
    before the first computation.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_cpu_multi_thread_eigen" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()


def env_rank_timeout_s(config: ExperimentConfig) -> float:
    """How long an env rank waits for the learner before it gives up: twice
    `run.transport_timeout_s`. When one env rank falls silent, the learner (which waits on it)
    must be the first to run out and name it; the other env ranks, waiting on the learner,
    would otherwise sometimes give up first and name nobody useful. It also gives the
    learner's first compilation more room."""
    return 2.0 * config.run.transport_timeout_s


def check_spaces_fit(config: ExperimentConfig, spaces: EnvSpaces, action_space: Any) -> None:
    """Settings that the env's spaces rule out, as start-up errors naming the field:
    SAC on non-Box actions or images, observation normalization of images, a CNN torso on
    non-image observations."""
    from agentenv_jax.envs.factory import EnvError
    from agentenv_jax.networks.torso_choice import resolve_torso

    env_id = config.env.id
    check_text_settings(config, spaces)
    if spaces.agents > 1 and config.algorithm.name != "ppo":
        raise EnvError(
            f"env.id = {env_id!r} is a multi-agent env ({spaces.agents} agents): "
            f"algorithm.name = {config.algorithm.name!r} is not supported for it; use 'ppo' "
            "(MAPPO with network.critic = 'centralised', IPPO with 'independent')"
        )
    if config.network.policies == "per_group" and spaces.agents == 1:
        raise EnvError(
            f"network.policies = 'per_group' needs a multi-agent env; env.id = {env_id!r} has "
            "one agent (use 'shared')"
        )
    if config.algorithm.name == "sac" and spaces.action_kind != "continuous":
        raise EnvError(
            f"env.id = {env_id!r} has action space {action_space}: algorithm.name = 'sac' "
            "needs a Box action space (use 'ppo' or 'impala' for discrete actions)"
        )
    observed = f"env.id = {env_id!r} observes {spaces.obs_dtype} images {spaces.obs_shape}"
    if config.algorithm.name == "sac" and spaces.is_image:
        raise EnvError(f"{observed}: algorithm.name = 'sac' needs vector observations")
    if spaces.is_image and config.env.normalize_obs:
        # Pixels are scaled by 1/255 in the network; per-pixel running statistics would cost
        # 2 float64 per pixel in every message and are not what pixel agents use.
        raise EnvError(
            f"{observed}: env.normalize_obs = true is not allowed for images (the network "
            "scales pixels to [0, 1]); set env.normalize_obs = false"
        )
    try:
        resolve_torso(config.network.torso, spaces.is_image)
    except ValueError as err:
        raise EnvError(f"{err} (env.id = {env_id!r} observes Box{spaces.obs_shape})") from None


def check_text_settings(config: ExperimentConfig, spaces: EnvSpaces) -> None:
    """Text envs train by token-level PPO; the text-only settings need a text env."""
    from agentenv_jax.envs.factory import EnvError

    algo, env_id = config.algorithm, config.env.id
    if spaces.text is None:
        text_only = algo.text_settings() if algo.name == "ppo" else []
        if text_only:
            names = ", ".join(f"algorithm.{name}" for name in text_only)
            raise EnvError(
                f"{names}: for text envs (token-level PPO); env.id = {env_id!r} is not one: "
                "leave them at their defaults"
            )
        return
    if algo.name != "ppo":
        raise EnvError(
            f"env.id = {env_id!r} is a text env: algorithm.name = {algo.name!r} is not "
            "supported for it; use 'ppo' (token-level PPO; algorithm.advantage = 'group' for "
            "the critic-free group baseline)"
        )
    if config.env.normalize_obs:
        raise EnvError(
            f"env.id = {env_id!r} observes token ids: env.normalize_obs = true is not allowed "
            "(set it false)"
        )
    if algo.partial_rollout_steps:
        needs = [
            (algo.max_policy_lag > 0, "algorithm.max_policy_lag", algo.max_policy_lag, "> 0"),
            (
                config.topology.inference == "env_ranks",
                "topology.inference",
                config.topology.inference,
                "'env_ranks'",
            ),
            (
                not config.network.language_model.generation_slots,
                "network.language_model.generation_slots",
                config.network.language_model.generation_slots,
                "0",
            ),
            (not config.env.normalize_reward, "env.normalize_reward", True, "false"),
        ]
        for ok, field, value, allowed in needs:
            if not ok:
                raise EnvError(
                    f"algorithm.partial_rollout_steps = {algo.partial_rollout_steps} needs "
                    f"{field} {allowed} (got {value!r}): answers continue under new parameters "
                    "on env ranks that run ahead, each generating its own batch"
                )
    message = spaces.text.context_length + spaces.text.response_length
    if 0 < algo.packed_row_length < message:
        raise EnvError(
            f"algorithm.packed_row_length = {algo.packed_row_length}: a packed row must hold "
            f"the longest message, context_length + response_length = {message} tokens; "
            f"allowed: 0 (off) or an integer >= {message}"
        )


def check_frozen_opponent(config: ExperimentConfig, vector_env: Any) -> None:
    """A frozen opponent's messages are generated by the env rank's own policy, which central
    inference does not have."""
    from agentenv_jax.envs.factory import EnvError

    if getattr(vector_env, "needs_frozen_opponent", False) and config.topology.inference != (
        "env_ranks"
    ):
        raise EnvError(
            f"env.kwargs.opponent = {config.env.kwargs.get('opponent')!r} needs "
            f"topology.inference = 'env_ranks' (got {config.topology.inference!r}): the frozen "
            "opponent's messages are generated by each env rank's own copy of the first policy"
        )


def check_group_baseline(config: ExperimentConfig, vector_env: Any) -> None:
    """The group baseline compares the episodes of one prompt. On a multi-turn task they run
    in rounds of `max_turns` messages (`TextVectorEnv(round_turns=...)`), so a segment must
    hold whole rounds."""
    from agentenv_jax.envs.factory import EnvError

    text = getattr(vector_env, "text_spec", None)
    rounds = text.episode_round if text is not None else 1
    algo = config.algorithm
    seats = getattr(vector_env, "seats", 1)
    if seats > 1 and algo.advantage == "gae":
        raise EnvError(
            f"env.id = {config.env.id!r} is a game of {seats} seats played in self-play: it "
            "needs algorithm.advantage = 'group' or 'rloo' (a seat's last reward can come on "
            "another seat's move, which whole-episode advantages count and GAE would not)"
        )
    if rounds <= 1:
        return
    if algo.rollout_length % rounds:
        raise EnvError(
            f"algorithm.rollout_length = {algo.rollout_length} must be a multiple of "
            f"{rounds} under algorithm.advantage = {algo.advantage!r}: env.id = "
            f"{config.env.id!r} takes up to {rounds} messages per episode, and each segment "
            "holds whole rounds of a group's episodes"
        )
    if algo.dynamic_sampling:
        raise EnvError(
            f"algorithm.dynamic_sampling = true is not supported on a multi-turn env (env.id "
            f"= {config.env.id!r}, up to {rounds} messages per episode); set it false"
        )


def prepare_env_rank(config: ExperimentConfig, topology: Topology):
    from agentenv_jax.envs.factory import check_first_reset, make_vector_env, vector_env_spaces

    envs = topology.local_num_envs[topology.env_rank_index]
    # Refused before the envs are made (a billion of them would fill the memory first), and
    # again with the spaces' sizes before the segments or the replay partition are allocated.
    check_memory(config, env_rank_envs=envs, learner=topology.is_learner)
    tokenizer = None
    if config.network.language_model.pretrained is not None:
        from agentenv_jax.networks.text_models import text_tokenizer

        tokenizer = text_tokenizer(config.network.language_model)
    vector_env = make_vector_env(
        config.env,
        envs,
        config.network.critic,
        group_size=getattr(config.algorithm, "group_size", 1),
        tokenizer=tokenizer,
        episode_groups=getattr(config.algorithm, "advantage", "gae") != "gae",
    )
    try:
        check_first_reset(vector_env, config.env)
        spaces = vector_env_spaces(config.env.id, vector_env)
        if not config.env.frames_once:  # whole stacks on the wire (`buffers.frame_stacks`)
            spaces = dataclasses.replace(spaces, stacked_frames=0)
        check_spaces_fit(config, spaces, vector_env.single_action_space)
        check_memory(config, spaces, env_rank_envs=envs, learner=topology.is_learner)
        check_group_baseline(config, vector_env)
        check_frozen_opponent(config, vector_env)
    except Exception:
        vector_env.close()
        raise
    return vector_env, spaces


def build_actor(
    config,
    topology,
    vector_env,
    spaces,
    channel,
    segment_spec,
    param_spec,
    network=None,
    inference_specs=None,
    layout=None,
):
    """An env rank's on-policy `Actor` (`network` and `layout` as for `build_actor_policy`);
    with `inference_specs` (request, reply), its policy asks the learner
    (`channel.inference_call`)."""
    from agentenv_jax.actor.loop import Actor

    if inference_specs is not None:
        from agentenv_jax.actor.remote_policy import RemotePolicy

        policy = RemotePolicy(channel.inference_call, *inference_specs)
    else:
        policy = build_actor_policy(config, topology, spaces, network, layout)
        if getattr(vector_env, "needs_frozen_opponent", False):
            vector_env.frozen_opponent = policy.frozen_opponent()
    index = topology.env_rank_index
    return Actor(
        vector_env,
        spaces,
        policy,
        channel,
        segment_spec,
        param_spec,
        seed=config.run.seed,
        env_offset=topology.env_offsets[index],
        rollout_length=config.algorithm.rollout_length,
        gamma=config.algorithm.gamma,
        normalize_obs=config.env.normalize_obs,
        normalize_reward=config.env.normalize_reward,
        clip_obs=config.env.clip_obs,
        clip_reward=config.env.clip_reward,
        max_inflight_segments=config.topology.max_inflight_segments,
        max_policy_lag=getattr(config.algorithm, "max_policy_lag", 0),
        timeout_s=env_rank_timeout_s(config),
        # Critic-free group advantages (GRPO, RLOO) read no state values.
        bootstraps=getattr(config.algorithm, "advantage", "gae") == "gae",
    )


@dataclasses.dataclass
class RolePlan:
    """How an experiment's two roles are built and joined: the on-policy family (PPO, IMPALA:
    segment queues) or the replay family (SAC: replay partitions). Both transports, in-process
    and MPI, carry the same messages."""

    param_spec: Any
    make_actor: Callable[[Any, Any], Any]  # (vector_env, channel) -> actor
    # (channel, num_devices, writer, progress, group=None) -> learner; `group`: the learner
    # processes sharing the mesh (`LearnerGroup`), None for a single learner
    make_learner: Callable[..., Any]
    make_inprocess: Callable[[], Any]  # -> transport with .actor and .learner ends
    make_mpi_actor_channel: Callable[[Any], Any]  # (MPIWorld) -> channel
    make_mpi_learner_channel: Callable[[Any], Any]  # (MPIWorld) -> channel


def on_policy_plan(
    config: ExperimentConfig, topology: Topology, spaces, leaf_paths: Any = None
) -> RolePlan:
    """The on-policy plan; on an env rank, `leaf_paths` (`env_rank_leaf_paths`, sent by the
    learner) spare it building the network, and with it importing JAX, unless its policy is
    jitted."""
    from agentenv_jax.buffers.segment_queue import on_policy_segment_spec
    from agentenv_jax.networks.flat_params import FlatLayout
    from agentenv_jax.transport.inprocess import InProcessInference, InProcessTransport
    from agentenv_jax.transport.messages import param_message_spec

    if leaf_paths is not None and topology.is_env_rank:
        network, layout = None, FlatLayout.from_leaf_paths(leaf_paths)
    else:
        network = actor_critic_network(config, spaces)
        layout = network[2]
    num_params = layout.num_params
    segment_specs = [
        on_policy_segment_spec(spaces, config.algorithm.rollout_length, n * spaces.agents)
        for n in topology.local_num_envs
    ]
    central = config.topology.inference == "learner"
    # With central inference, parameter messages carry the version and statistics only.
    param_spec = param_message_spec(0 if central else num_params, spaces.normalizer_dim)
    specs = inference_specs(spaces, topology) if central else None
    inflight = config.topology.max_inflight_segments
    # Each learner's env ranks (indices), and their segment layouts, per learner.
    feeders = [topology.env_ranks_of(learner) for learner in range(topology.num_learner_ranks)]
    specs_by_learner = [[segment_specs[i] for i in indices] for indices in feeders]
    learner = topology.learner_index if topology.is_learner else 0

    def mpi_actor_channel(world):
        from agentenv_jax.transport.mpi import MPIActorChannel

        learner_rank = topology.learner_of(topology.env_rank_index)
        channel = MPIActorChannel(
            world.comm,
            learner_rank=learner_rank,
            param_nbytes=param_spec.nbytes,
            param_group=world.param_comm,
        )
        if central:
            from agentenv_jax.transport.mpi.inference import MPIInferenceClient

            channel.inference_call = MPIInferenceClient(
                world.comm,
                learner_rank,
                specs[topology.env_rank_index][1].nbytes,
                env_rank_timeout_s(config),
                channel.stop_requested,
            ).call
        return channel

    def mpi_learner_channel(world):
        from agentenv_jax.transport.mpi import MPILearnerChannel

        env_ranks = [topology.env_rank_of(i) for i in feeders[learner]]
        channel = MPILearnerChannel(
            world.comm,
            env_ranks,
            [s.nbytes for s in specs_by_learner[learner]],
            inflight,
            param_spec.nbytes,
            world.param_comm,
        )
        if central:
            from agentenv_jax.transport.mpi.inference import MPIInferenceEndpoint

            channel.inference_endpoint = MPIInferenceEndpoint(
                world.comm,
                env_ranks,
                [specs[i][0].nbytes for i in feeders[learner]],
                [specs[i][1].nbytes for i in feeders[learner]],
            )
        return channel

    def make_inprocess():
        transport = InProcessTransport(inflight)
        if central:
            link = InProcessInference(*specs[0])
            transport.actor.inference_call = link.call
            transport.learner.inference_endpoint = link
        return transport

    def make_server(channel, device):
        """The learner's central inference server for its env ranks."""
        from agentenv_jax.learner.inference_server import InferenceServer

        policy = build_central_policy(config, spaces, network, device)
        mine = feeders[learner]
        endpoint = channel.inference_endpoint
        # In one process the env rank's call is answered at once (`InProcessInference`):
        # there is nothing for a thread to serve.
        threaded = config.topology.inference_serving == "thread" and not hasattr(endpoint, "attach")
        if threaded:
            from agentenv_jax.transport.mpi.inference import require_thread_multiple

            require_thread_multiple()
        server = InferenceServer(
            policy,
            endpoint,
            [specs[i][0] for i in mine],
            [specs[i][1] for i in mine],
            central_noise_sources(config, topology, spaces, policy, mine),
            text=spaces.text,
            threaded=threaded,
        )
        if hasattr(endpoint, "attach"):
            endpoint.attach(server)
        return server

    return RolePlan(
        param_spec,
        lambda env, channel: build_actor(
            config,
            topology,
            env,
            spaces,
            channel,
            segment_specs[topology.env_rank_index],
            param_spec,
            network,
            specs[topology.env_rank_index] if central else None,
            layout,
        ),
        lambda channel, devices, writer, progress, group=None: _on_policy_learner(
            config,
            spaces,
            channel,
            specs_by_learner[learner],
            param_spec,
            devices,
            writer,
            progress,
            group,
            specs_by_learner,
            make_server if central else None,
        ),
        make_inprocess,
        mpi_actor_channel,
        mpi_learner_channel,
    )


def _on_policy_learner(*args: Any) -> Any:
    """The on-policy `Learner` (imported here: env ranks never load the learner's modules)."""
    from agentenv_jax.learner.loop import Learner

    return Learner(*args)


def replay_plan(
    config: ExperimentConfig,
    topology: Topology,
    spaces,
    replay_source: tuple[int, int] | None = None,
) -> RolePlan:
    """Replay mode; `replay_source` is the (checkpoint update, saved partition count) of the
    saved partitions a resumed run loads back, if any."""
    from agentenv_jax.actor.policy import SquashedGaussianPolicy
    from agentenv_jax.actor.replay_loop import ReplayActor
    from agentenv_jax.buffers.replay import ReplayPartition
    from agentenv_jax.checkpoint import replay_files
    from agentenv_jax.checkpoint.store import CheckpointError
    from agentenv_jax.learner.replay_loop import ReplayLearner
    from agentenv_jax.learner.sac_training import sac_networks_for
    from agentenv_jax.networks.flat_params import FlatLayout
    from agentenv_jax.transport import messages
    from agentenv_jax.transport.inprocess import InProcessReplayTransport

    algo = config.algorithm
    networks = sac_networks_for(config, spaces)
    actor_layout = FlatLayout(networks.param_shapes[0])
    param_spec = messages.param_message_spec(actor_layout.num_params, spaces.normalizer_dim)
    request_spec = messages.sample_request_spec()
    answer_spec = messages.sample_answer_spec(algo.batch_size, spaces.obs_shape, spaces.action_size)
    priority_spec = messages.priority_update_spec(algo.batch_size)
    sizes = (param_spec.nbytes, request_spec.nbytes, answer_spec.nbytes, priority_spec.nbytes)
    index = topology.env_rank_index
    share = topology.local_num_envs[index] / topology.global_num_envs

    def make_actor(vector_env, channel):
        offset = topology.env_offsets[index]
        policy = SquashedGaussianPolicy(
            networks.actor_apply,
            actor_layout.unravel,
            spaces.action_size,
            [config.run.seed, offset],
        )
        partition = ReplayPartition(
            max(1, round(algo.replay_capacity * share)),
            spaces.obs_shape,
            spaces.action_size,
            prioritized=algo.prioritized,
            alpha=algo.priority_alpha,
            n_step=algo.n_step,
            gamma=algo.gamma,
            num_envs=topology.local_num_envs[index],
        )
        run_dir = Path(config.run.run_dir) / str(config.run.name)  # used only when named
        if replay_source is not None:
            update, num_saved = replay_source
            shares = replay_files.load_share(
                run_dir, update, num_saved, index, topology.num_env_ranks
            )
            try:
                partition.restore(shares)
            except ValueError as err:
                raise CheckpointError(
                    f"saved replay partitions in {replay_files.replay_dir(run_dir, update)} "
                    f"do not fit this run: {err}"
                ) from err

        def save_partition(update: int, snapshot: dict) -> None:
            replay_files.save_partition(run_dir, update, index, topology.num_env_ranks, snapshot)

        return ReplayActor(
            vector_env,
            spaces,
            policy,
            channel,
            partition,
            param_spec,
            request_spec,
            answer_spec,
            priority_spec,
            seed=config.run.seed,
            env_offset=offset,
            # A restored partition already holds experience: no uniform-random warm-up.
            random_steps=0 if partition.size else round(algo.learning_starts * share),
            timeout_s=env_rank_timeout_s(config),
            save_partition=save_partition if config.checkpoint.save_replay else None,
        )

    # Partitions are numbered learner-major: each learner's own form one block.
    feeders = [topology.env_ranks_of(learner) for learner in range(topology.num_learner_ranks)]
    learner = topology.learner_index if topology.is_learner else 0

    def mpi_actor_channel(world):
        from agentenv_jax.transport.mpi import MPIReplayActorChannel

        return MPIReplayActorChannel(
            world.comm, topology.learner_of(index), *sizes, param_group=world.param_comm
        )

    def mpi_learner_channel(world):
        from agentenv_jax.transport.mpi import MPIReplayLearnerChannel

        return MPIReplayLearnerChannel(
            world.comm,
            [topology.env_rank_of(i) for i in feeders[learner]],
            *sizes,
            param_group=world.param_comm,
        )

    return RolePlan(
        param_spec,
        make_actor,
        lambda channel, devices, writer, progress, group=None: ReplayLearner(
            config,
            spaces,
            channel,
            param_spec,
            request_spec,
            answer_spec,
            priority_spec,
            tuple(topology.local_num_envs[i] for i in topology.learner_major()),
            devices,
            writer,
            progress,
            group,
            [len(indices) for indices in feeders],
        ),
        InProcessReplayTransport,
        mpi_actor_channel,
        mpi_learner_channel,
    )


def plan_for(
    config: ExperimentConfig,
    topology: Topology,
    spaces,
    replay_source: tuple[int, int] | None = None,
    leaf_paths: Any = None,
) -> RolePlan:
    """The plan of `config`'s algorithm; `leaf_paths` as for `on_policy_plan`."""
    if config.algorithm.name == "sac":
        return replay_plan(config, topology, spaces, replay_source)
    return on_policy_plan(config, topology, spaces, leaf_paths)
