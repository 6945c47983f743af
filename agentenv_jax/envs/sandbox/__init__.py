"""Programs run in isolation under real limits: the sandbox that code tools and code tasks use."""

from agentenv_jax.envs.sandbox.pool import (
    SandboxError,
    SandboxPool,
    SandboxResult,
    SandboxSettings,
    SandboxWorker,
    close_shared_pools,
    shared_pool,
)

__all__ = [
    "SandboxError",
    "SandboxPool",
    "SandboxResult",
    "SandboxSettings",
    "SandboxWorker",
    "close_shared_pools",
    "shared_pool",
]
