"""Typed experiment configuration: schema, YAML loading, dotted overrides and validation."""

from agentenv_jax.config.errors import ConfigError
from agentenv_jax.config.loading import (
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    save_config,
)
from agentenv_jax.config.schema import (
    CheckpointConfig,
    EnvConfig,
    ExperimentConfig,
    NetworkConfig,
    PPOConfig,
    RunConfig,
    TopologyConfig,
)

__all__ = [
    "CheckpointConfig",
    "ConfigError",
    "EnvConfig",
    "ExperimentConfig",
    "NetworkConfig",
    "PPOConfig",
    "RunConfig",
    "TopologyConfig",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "save_config",
]
